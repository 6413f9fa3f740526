"""A node at a CPU quota (``simulate --node-speed``, ``bench/simulate/quota.py``): its
ranks' data, update and codec are slowed with their compute; their time inside MPI is
not."""

from __future__ import annotations

import re

import numpy as np
import pytest

from syncbench.bench.cli import build_parser
from syncbench.bench.simulate import strategies
from syncbench.bench.simulate.quota import (
    Throttle,
    parse_node_speeds,
    parse_node_throttles,
    quota_codec,
    quota_delay,
    realised_shares,
    throttle_spec,
)
from syncbench.bench.simulate.timeline import LocalTimes
from syncbench.bench.simulate.workload import ComputeSplit, Stragglers, Workload

SPLIT = ComputeSplit(forward=(0.5,), backward=(0.75, 1.0), offsets=(500, 0))
COMPUTE, UPDATE, STAGE = 1.0, 0.1, 0.6


def blocking_ssgd(speeds, slowdown=(1.0, 1.0), steps=6):
    """SSGD --comm blocking on 2 ranks, 1 s compute, 0.1 s update, 0.6 s per stage of
    the Allreduce; ``speeds`` as ``simulate --node-speed`` passes them."""
    cfg = build_parser("simulate").parse_args(["simulate", "--comm", "blocking"])
    w = Workload(name="test", params=1000, batch_size=1, dataset_samples=1000,
                 mean_compute_s=COMPUTE, mean_update_s=UPDATE, split=SPLIT)
    factors = [f / s for f, s in zip(slowdown, speeds or (1.0, 1.0))]
    local = LocalTimes(w, 2, factors, Stragglers(), seed=0, speeds=speeds)
    return strategies.ssgd(cfg, local, steps, lambda phase: STAGE)


def test_a_throttled_rank_pays_its_data_and_update_at_its_share_not_its_time_in_mpi():
    """Speed 0.5: the throttled rank's step is (compute + update) / 0.5 + Allreduce,
    where a 2x --slowdown (compute only) gives 2 x compute + update + Allreduce."""
    quota = blocking_ssgd([1.0, 0.5])
    slowed = blocking_ssgd(None, slowdown=(1.0, 2.0))
    steps = 6
    allreduce = float(slowed.rows.arrays()[1]["t_comm"][0])  # the slow rank waits for none
    assert allreduce == pytest.approx(2 * STAGE)
    assert slowed.wall_s == pytest.approx(steps * (2 * COMPUTE + UPDATE + allreduce))
    assert quota.wall_s == pytest.approx(steps * ((COMPUTE + UPDATE) / 0.5 + allreduce))
    rows = quota.rows.arrays()
    assert np.all(rows[0]["t_delay"] == 0.0)  # the node at full speed owes nothing
    assert rows[1]["t_delay"] == pytest.approx([COMPUTE + UPDATE] * steps)


def test_the_quota_delay_is_data_and_update_times_one_over_the_share_minus_one():
    block = np.zeros((2, 2, 4))
    block[..., 0], block[..., 2] = 0.1, 0.3  # data, update
    np.testing.assert_allclose(quota_delay(block, [1.0, 0.25]), [[0, 0], [1.2, 1.2]])


def test_the_codec_at_a_quota_takes_its_seconds_over_the_share():
    np.testing.assert_allclose(quota_codec(0.01, [1.0, 0.25], 2), [0.01, 0.04])
    np.testing.assert_allclose(quota_codec(np.array([0.01, 0.02]), None, 2), [0.01, 0.02])


def test_a_throttled_rank_pays_its_codec_at_its_share():
    """--compress fp16 --codec-seconds 0.05 on 2 ranks, the second at speed 0.5: its
    t_codec is 0.1 s a step, the free rank's 0.05 s, and the throttled rank's step is
    (compute + update + codec) / 0.5 plus the collectives."""
    cfg = build_parser("simulate").parse_args(
        ["simulate", "--comm", "blocking", "--compress", "fp16", "--codec-seconds", "0.05"])
    w = Workload(name="test", params=1000, batch_size=1, dataset_samples=1000,
                 mean_compute_s=COMPUTE, mean_update_s=UPDATE, split=SPLIT)
    local = LocalTimes(w, 2, [1.0, 2.0], Stragglers(), seed=0, speeds=[1.0, 0.5])
    rows = strategies.simulator_for("ssgd")(cfg, local, 3, lambda phase: STAGE).rows.arrays()
    assert rows[0]["t_codec"] == pytest.approx([0.05] * 3)
    assert rows[1]["t_codec"] == pytest.approx([0.1] * 3)
    assert rows[1]["t_update"] == pytest.approx([UPDATE] * 3)  # slowed in delay, as before
    assert rows[1]["t_delay"] == pytest.approx([COMPUTE + UPDATE] * 3)


@pytest.mark.parametrize("spec, message", [
    ("1,0", "must be in (0, 1]"), ("1,1.5", "must be in (0, 1]"),
    ("1", "has 1 shares but the job has 2 ranks"), ("1,x", "is not a number")])
def test_bad_node_speeds_are_one_line(spec, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_node_speeds(spec, 2)


def test_every_rank_at_full_speed_is_no_quota():
    assert parse_node_speeds("1,1", 2) is None
    assert parse_node_speeds(None, 2) is None
    assert parse_node_speeds("1,0.5", 2) == [1.0, 0.5]


# -- the kernel's bursts (--node-throttle) ----------------------------------------------

def test_a_never_idle_process_runs_on_in_every_on_plus_off():
    burst = Throttle(3e-3, 5e-3)
    busy = np.full(100, 4e-3)
    assert burst.share == pytest.approx(3 / 8)
    assert burst.busy_wall(busy, np.zeros(100)) == pytest.approx(busy.sum() / burst.share,
                                                                 rel=0.01)


def test_a_process_idle_for_the_frozen_span_starts_each_block_with_a_whole_burst():
    """A block shorter than a burst after a long wait runs at full speed; one longer is
    frozen once per burst it outlasts."""
    burst = Throttle(3e-3, 5e-3)
    assert burst.busy_wall(np.full(10, 2e-3), np.full(10, 5e-3)) == pytest.approx(20e-3)
    assert burst.busy_wall(np.full(10, 4e-3), np.full(10, 40e-3)) == pytest.approx(10 * 9e-3)
    # a short wait restores a part of the credit: between the two
    short = burst.busy_wall(np.full(10, 4e-3), np.full(10, 1e-3))
    assert 10 * 9e-3 < short < 10 * 4e-3 / burst.share


def test_a_wait_spent_polling_gives_the_quota_no_rest():
    """A 2 ms block after each 2 ms wait: a process that sleeps through its waits gets
    1.2 ms of credit back from each (a whole burst's 3 ms per 5 ms idle); one that polls
    through them (MPICH's waits, ``wait_cpu`` 1) gets none and runs at its never-idle
    share, 3/8, the freezes of its whole count of bursts aside; half polling lies
    between."""
    import dataclasses

    busy, idle = np.full(60, 2e-3), np.full(60, 2e-3)
    sleeping = Throttle(3e-3, 5e-3)
    half = dataclasses.replace(sleeping, wait_cpu=0.5)
    polling = dataclasses.replace(sleeping, wait_cpu=1.0)
    never_idle = sleeping.busy_wall(busy, np.zeros(60))
    assert polling.busy_wall(busy, idle) == pytest.approx(never_idle)
    assert never_idle == pytest.approx(busy.sum() / sleeping.share, rel=0.05)
    assert (sleeping.busy_wall(busy, idle) < half.busy_wall(busy, idle)
            < polling.busy_wall(busy, idle))


def test_the_share_of_a_wait_on_the_cpu_is_checked_and_defaults_to_mpichs_polling():
    from syncbench.bench.simulate.quota import MPI_WAIT_CPU, parse_wait_cpu

    assert parse_wait_cpu(None) == MPI_WAIT_CPU == 1.0
    assert parse_wait_cpu("0.25") == 0.25
    for bad, words in (("x", "is not a number"), ("1.5", "in [0, 1]"), ("-0.1", "in [0, 1]"),
                       ("nan", "in [0, 1]")):
        with pytest.raises(ValueError, match=r"--node-wait-cpu .*" + re.escape(words)):
            parse_wait_cpu(bad)


def test_a_block_after_a_wait_is_frozen_as_often_as_the_first_burst_falls_short_of_it():
    """The first burst after an idle spell is spread (where the tick falls against the
    period's refill): uniform with 10th and 90th percentiles 2.2 and 5.0 ms is sampled at
    2.2, 2.9, 3.6, 4.3 and 5.0 ms. A 4 ms block outlasts three of them, a 3 ms block two;
    a 16 ms block then runs at the never-idle share: 4.95, 6.93 and 35.4 ms. On the
    emulated cluster an MPI rank's compute after a wait took 3.69, 7.34 and 35.75 ms on
    average at a pattern of 3.18/4.80/1.77-5.00 (docs/RESULTS.md, "A quota's first
    burst"); the model before (a first burst of ``on_s``, whole freezes) gave 3, 8.9 and
    40.4 ms here."""
    burst = Throttle(3.12e-3, 4.88e-3, 2.2e-3, 5.0e-3)
    assert burst.first_bursts() == pytest.approx([2.2e-3, 2.9e-3, 3.6e-3, 4.3e-3, 5.0e-3])
    wait = np.array([0.1])
    assert burst.busy_wall(np.array([3e-3]), wait) == pytest.approx(3e-3 + 0.4 * 4.88e-3)
    assert burst.busy_wall(np.array([4e-3]), wait) == pytest.approx(4e-3 + 0.6 * 4.88e-3)
    long = 16e-3 + 4.88e-3 * (16e-3 - 3.6e-3) / 3.12e-3
    assert burst.busy_wall(np.array([16e-3]), wait) == pytest.approx(long)
    assert 34e-3 <= long <= 37e-3
    point = Throttle(3.12e-3, 4.88e-3)
    assert point.first_bursts() == [3.12e-3]
    assert point.busy_wall(np.array([4e-3]), wait) == pytest.approx(4e-3 + 4.88e-3)


def test_realised_shares_follow_each_throttled_ranks_busy_and_idle_rows():
    n = 40
    rows = {k: {"step": np.arange(n), "t_data": np.zeros(n), "t_compute": np.full(n, 2e-3),
                "t_delay": np.full(n, 2e-3 * k), "t_update": np.zeros(n),
                "t_codec": np.zeros(n), "t_comm": np.zeros(n), "t_wait": np.zeros(n)}
            for k in (0, 1)}
    burst = Throttle(3e-3, 5e-3)
    shares = realised_shares(rows, [1.0, 0.5], [None, burst])
    assert shares[0] == 1.0  # no pattern: the rank keeps its share
    # rank 1 did 2 ms of CPU a step (4 ms of phases at share 0.5), never idle
    assert shares[1] == pytest.approx(burst.share, rel=0.05)


@pytest.mark.parametrize("spec,speeds,expect", [
    ("3.3/4.7", [1.0, 0.5], [None, Throttle(3.3e-3, 4.7e-3)]),
    ("-,1/3", [0.5, 0.25], [None, Throttle(1e-3, 3e-3)]),
    ("1/3,1/3", [1.0, 0.25], [None, Throttle(1e-3, 3e-3)]),  # none for a rank at speed 1
    ("2/2", None, None),  # one pattern and no rank at a quota: nothing to throttle
    ("", [1.0, 0.5], None),
    ("3.1/4.9/2.2-5", [1.0, 0.5], [None, Throttle(*(t / 1e3 for t in (3.1, 4.9, 2.2, 5)))]),
])
def test_node_throttles_name_each_rank_or_every_rank_at_a_quota(spec, speeds, expect):
    assert parse_node_throttles(spec, speeds, 2) == expect
    if expect is not None:
        assert parse_node_throttles(throttle_spec(expect), speeds, 2) == expect


@pytest.mark.parametrize("spec,message", [
    ("3.3", "is not ON/OFF or ON/OFF/LO-HI in milliseconds"),
    ("1/0", "every time must be > 0"),
    ("1/2,1/2,1/2", "3 entries but the job has 2"),
    ("a/b", "is not ON/OFF or ON/OFF/LO-HI in milliseconds"),
    ("3/5/2", "the first burst is LO-HI milliseconds"),
    ("3/5/4-2", "the first burst's LO exceeds its HI"),
    ("3/5/0-2", "every time must be > 0"),
    ("3/5/x-2", "is not ON/OFF or ON/OFF/LO-HI in milliseconds"),
])
def test_bad_node_throttles_are_one_line(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_node_throttles(spec, [1.0, 0.5], 2)


def test_a_throttle_without_a_quota_is_one_line():
    from syncbench.bench.simulate.single import check_strategy

    args = build_parser("simulate").parse_args(["simulate", "--node-throttle", "3.3/4.7"])
    with pytest.raises(ValueError, match="give --node-speed"):
        check_strategy(args, 2)
    args.node_speed = "1,0.5"
    check_strategy(args, 2)


def test_the_block_benchmark_prints_the_models_wall_beside_the_measured_one():
    """bench/micro/quota_blocks.py sets each block's measured wall beside the model's, from
    the node's pattern as the cluster exports it; without a pattern, NaN."""
    from syncbench.bench.micro.quota_blocks import _predicted_ms

    spread = _predicted_ms("3.12/4.88/2.2-5.0", 4.0, spread=True)
    assert spread == pytest.approx(4.0 + 0.6 * 4.88)
    assert _predicted_ms("3.12/4.88/2.2-5.0", 4.0, spread=False) == pytest.approx(4.0 + 4.88)
    assert np.isnan(_predicted_ms("", 4.0, spread=True))
    assert np.isnan(_predicted_ms("x/y", 4.0, spread=True))


@pytest.mark.parametrize("flags", [["--blocks-ms", "0"], ["--blocks-ms", "1,x"],
                                   ["--blocks-ms", "1,nan"], ["--blocks-ms", "inf"],
                                   ["--repeats", "0"], ["--wait-ms", "-1"],
                                   ["--wait-ms", "inf"]])
def test_the_block_benchmarks_bad_input_is_one_line(capsys, flags):
    from syncbench.bench.micro.quota_blocks import main

    assert main(flags) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "quota_blocks: run 2 ranks, rank 1 on the node at a quota, with --blocks-ms > 0, "
        "--wait-ms >= 0 and --repeats >= 1"]


@pytest.mark.parametrize("pattern,expect", [
    ("3.1/4.9", (3.1e-3, 4.9e-3, None, None)),
    ("3.1/4.9/2.2-5", (3.1e-3, 4.9e-3, 2.2e-3, 5e-3)),
    ("3.1/4.9/5-2.2", (3.1e-3, 4.9e-3, None, None)),  # LO above HI: no spread
    ("3.1/4.9/x-2", (3.1e-3, 4.9e-3, None, None)),
    ("x/4.9/2-3", (None, None, None, None)),
    ("", (None, None, None, None)),
])
def test_a_rank_records_its_nodes_quota_pattern_as_the_cluster_exports_it(monkeypatch,
                                                                           pattern, expect):
    """$SYNCBENCH_NODE_THROTTLE (ON/OFF[/LO-HI] ms) to the four rank attributes, NaN for
    what is absent or not a pattern."""
    from syncbench.bench.train.node_env import node_throttle

    monkeypatch.setenv("SYNCBENCH_NODE_THROTTLE", pattern)
    got = node_throttle()
    keys = ("node_throttle_on_s", "node_throttle_off_s", "node_throttle_first_lo_s",
            "node_throttle_first_hi_s")
    for key, want in zip(keys, expect):
        if want is None:
            assert np.isnan(got[key]), (key, got)
        else:
            assert got[key] == pytest.approx(want), (key, got)
