"""Simulated timelines that follow the code: progress only at polls, the straggler's place,
workloads that keep their structure (without SimGrid: phase durations are given).

Each timeline is composed by ``bench/simulate/strategies.py`` from a workload with a
known compute split and a stand-in for SimGrid's phase clock, so the expected times
are computed by hand in the tests.
"""

from __future__ import annotations

import dataclasses
import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from syncbench.analysis import schema
from syncbench.bench.cli import build_parser
from syncbench.bench.simulate import strategies
from syncbench.bench.simulate.timeline import LocalTimes
from syncbench.bench.simulate.workload import (
    ComputeSplit,
    Stragglers,
    Workload,
    delay_factors,
    from_profile,
    from_run,
    parse_stragglers,
)


def config(*flags: str):
    """``syncbench simulate``'s namespace: its defaults and ``flags``."""
    return build_parser("simulate").parse_args(["simulate", *flags])


def fixed_workload(params: int, split: ComputeSplit, compute: float = 1.0,
                   layer_offsets: list[int] | None = None) -> Workload:
    """Every step computes ``compute`` seconds; no data, no update, no noise."""
    return Workload(name="test", params=params, batch_size=1, dataset_samples=1000,
                    mean_compute_s=compute, split=split, layer_offsets=layer_offsets or [])


def every_phase(seconds: float):
    return lambda phase: seconds


@pytest.fixture
def free_polls(monkeypatch):
    """Polls that take no time, so the hand-computed instants are exact."""
    monkeypatch.setattr(strategies, "TESTALL_SECONDS", 0.0)


def rows_of(timeline):
    return timeline.rows.arrays()


# -- 1. progress only at polls -------------------------------------------------------

def test_odsgd_stages_advance_at_the_polls_and_the_rest_runs_in_the_wait(free_polls):
    """16 ranks: Rabenseifner in 8 stages of 0.4 s, 3.2 x a step's 1 s of compute.

    ODSGD._poll tests the request at every hook call: here after the forward
    (0.5 s into the compute) and after each backward layer (0.75 s, 1.0 s).
    Step 1 computes on [1, 2]: req0 (posted at 1.0) runs stage 1 on [1.0, 1.4],
    stage 2 from the poll at 1.5 to 1.9, stage 3 from the poll at 2.0; step 1
    posts req1 at 2.0 and waits for req0: stages 3-8 back to back, to 4.4, so
    the wait is 2.4 s. (Progress in the background gave 4.2 and a wait of 2.2.)
    Step 2 on [4.4, 5.4]: req1's stage 1 got the network at 4.4 (req0 had it
    until then), stage 2 from the poll at 4.9, stage 3 from 5.4, the rest in
    the wait: 5.4 + 2.4 = 7.8. finish() waits for req2: 7.8 + 8 x 0.4 = 11.0.
    """
    split = ComputeSplit(forward=(0.5,), backward=(0.75, 1.0), offsets=(500, 0))
    w = fixed_workload(1000, split)
    local = LocalTimes(w, 16, [1.0] * 16, Stragglers(), seed=0)
    timeline = strategies.odsgd(config("--algorithm", "odsgd", "--warmup-steps", "0"),
                                local, 3, every_phase(0.4))
    rows = rows_of(timeline)
    for k in (0, 15):
        assert rows[k]["t_wait"] == pytest.approx([0.0, 2.4, 2.4])
        assert rows[k]["t_start"] == pytest.approx([0.0, 1.0, 4.4])
        assert np.all(rows[k]["staleness"] == 1)
    assert timeline.wall_s == pytest.approx(11.0)


def test_ssgd_overlap_last_bucket_waits_for_the_straggler_and_stages_for_polls(free_polls):
    """2 ranks, 2 buckets of one layer each (4 kB: Rabenseifner), 2 stages of 0.1 s each.

    Backward reports offset 1000 at 0.7 s (bucket [1000, 2000) is posted) and 0
    at 1.0 s (the last bucket). Rank 1 (--slowdown 1,3) spends its 2 s of delay
    right before posting the last bucket (BucketedIallreduce.on_grads_ready), on [1, 3]. The
    first bucket's stage 1 runs on [0.7, 0.8]; no hook polls (both post), so
    stage 2 waits for rank 0's Waitall and rank 1's delay, both from 1.0, and
    ends at 1.1. The last bucket is posted at 3.0 and done at 3.2: rank 0
    waits 2.2 s, rank 1 0.2 s. (With the delay after every post, the last
    bucket ended at 1.2, hidden behind the delay, and step 1 began at 3.0.)
    """
    split = ComputeSplit(forward=(0.2, 0.4), backward=(0.7, 1.0), offsets=(1000, 0))
    w = fixed_workload(2000, split, layer_offsets=[0, 1000])
    local = LocalTimes(w, 2, [1.0, 3.0], Stragglers(), seed=0)
    cfg = config("--algorithm", "ssgd", "--comm", "overlap", "--bucket-mb", "0.004",
                 "--gpus-per-node", "2")  # work mode: the delay polls at the model's hooks
    timeline = strategies.ssgd(cfg, local, 2, every_phase(0.1))
    rows = rows_of(timeline)
    assert timeline.notes["buckets"] == 2
    assert rows[1]["t_delay"] == pytest.approx([2.0, 2.0])
    assert rows[0]["t_wait"] == pytest.approx([2.2, 2.2])
    assert rows[1]["t_wait"] == pytest.approx([0.2, 0.2])
    assert rows[0]["t_start"] == pytest.approx([0.0, 3.2])
    assert timeline.wall_s == pytest.approx(6.4)


def test_oscars_overlap_step_polls_and_the_wait_holds_the_rest(free_polls):
    """4 ranks, --period 1 --adaptive off: every round is one step. The packed
    reduction (4 stages of 0.3 s) is posted at 1.0 and overlaps round 1's step
    on [1, 2], whose polls at 1.5 and 2.0 issue stages 2 and 3 ([1.5, 1.8],
    [2.0, 2.3]); the Wait runs stage 4 to 2.6: a wait of 0.6 s, not the 0.2 s
    of a reduction that progressed on its own. The last round waits at once."""
    split = ComputeSplit(forward=(0.5,), backward=(1.0,), offsets=(0,))
    w = fixed_workload(1000, split)
    local = LocalTimes(w, 4, [1.0] * 4, Stragglers(), seed=0)
    cfg = config("--algorithm", "oscars", "--period", "1", "--adaptive", "off", "--overlap")
    timeline = strategies.oscars(cfg, local, 3, every_phase(0.3))
    rows = rows_of(timeline)
    assert rows[0]["t_start"] == pytest.approx([0.0, 1.0, 2.6])
    assert rows[0]["t_wait"] == pytest.approx([0.0, 0.6, 0.6 + 1.2])
    assert list(rows[0]["round"]) == [0, 1, 2]
    assert timeline.wall_s == pytest.approx(2.6 + 1.0 + 0.6 + 1.2)


def test_testall_cost_lengthens_the_compute_and_is_charged_to_comm():
    """OD-SGD polls at all 3 hook calls of a step with a request outstanding."""
    split = ComputeSplit(forward=(0.5,), backward=(0.75, 1.0), offsets=(500, 0))
    w = fixed_workload(1000, split, compute=1e-3)
    local = LocalTimes(w, 2, [1.0, 1.0], Stragglers(), seed=0)
    timeline = strategies.odsgd(config("--algorithm", "odsgd", "--warmup-steps", "0"),
                                local, 3, every_phase(1e-9))
    rows = rows_of(timeline)
    assert strategies.TESTALL_SECONDS > 0
    assert rows[0]["t_comm"] == pytest.approx([0.0] + [3 * strategies.TESTALL_SECONDS] * 2)
    assert rows[0]["t_compute"] == pytest.approx([1e-3] * 3)
    steps = np.diff(rows[0]["t_start"])
    assert steps[1] == pytest.approx(1e-3 + 3 * strategies.TESTALL_SECONDS, rel=1e-6)


def test_a_ring_runs_its_stages_back_to_back_in_the_wait(free_polls):
    """--allreduce ring on 64 ranks: 126 stages, all left to the Wait (no hook polls)."""
    split = ComputeSplit(forward=(1.0,), backward=(1.0,), offsets=(0,))
    w = fixed_workload(64000, split, layer_offsets=[0])
    local = LocalTimes(w, 64, [1.0] * 64, Stragglers(), seed=0)
    cfg = config("--algorithm", "ssgd", "--comm", "overlap", "--allreduce", "ring")
    timeline = strategies.ssgd(cfg, local, 2, every_phase(0.01))
    rows = rows_of(timeline)
    assert rows[5]["t_wait"] == pytest.approx([1.26, 1.26])


# -- 3. workloads keep their structure ----------------------------------------------------

def _write_measured_run(path, rows_per_rank: int = 30, between: np.ndarray | None = None
                        ) -> None:
    """A 2-rank mlp run: rank 0 computes 1.0-1.29 ms (a ramp), rank 1 the same ramp plus a
    2x delay of --slowdown 1,3 (as train records it); ``between``: each step's seconds
    outside its phases (none)."""
    from syncbench.bench.train.recorder import write_run_file

    ramp = 1e-3 + 1e-5 * np.arange(rows_per_rank)
    ranks = {}
    for rank in (0, 1):
        cols = {name: np.zeros(rows_per_rank, dtype=d) for name, d in schema.RANK_COLUMNS.items()}
        cols["step"] = np.arange(rows_per_rank)
        cols["t_compute"] = ramp + 5e-4 * rank
        cols["t_delay"] = 2 * cols["t_compute"] * rank
        cols["t_data"] = np.full(rows_per_rank, 1e-5)
        cols["t_update"] = np.full(rows_per_rank, 2e-5)
        cols["samples"] = np.full(rows_per_rank, 64)
        cols["loss"] = np.full(rows_per_rank, 1.0)
        steps = cols["t_compute"] + cols["t_delay"] + 3e-5
        if between is not None:
            steps = steps + between
        cols["t_start"] = np.concatenate([[0.0], np.cumsum(steps)[:-1]])
        ranks[rank] = cols
    root = {"algorithm": "ssgd", "model": "mlp", "dataset": "fashion-mnist", "world_size": 2,
            "config": json.dumps({"model": "mlp", "dataset": "fashion-mnist",
                                  "batch_size": 64, "slowdown": "1,3"})}
    empty = {name: np.zeros(0, dtype=d) for name, d in schema.EVAL_COLUMNS.items()}
    write_run_file(path, root, ranks, {0: {}, 1: {}}, empty, float(ranks[1]["t_start"][-1]),
                   None)


def test_a_measured_run_is_replayed_rank_by_rank_in_order(tmp_path):
    path = tmp_path / "measured.h5"
    _write_measured_run(path)
    w = from_run(str(path))
    assert w.rank_bounds == [0, 28, 56]  # the first two rows of each rank are left out
    local = LocalTimes(w, 6, [1.0] * 6, Stragglers(), seed=3)
    local.ensure(60)  # more steps than a measured rank has: its rows cycle
    measured = w.rows[:28, 1]
    for k in range(6):
        data, comp, upd, delay = (local.cols[k, :, i] for i in range(4))
        # simulated rank k is measured rank k % 2: rank 1's delay stays with ranks 1, 3, 5
        assert delay == pytest.approx(2 * comp if k % 2 else 0 * comp)
        # in the measured order, cycling, from a random start
        start = int(local.offsets[k])
        expected = (measured + 5e-4 * (k % 2))[(start + np.arange(60)) % 28]
        assert comp == pytest.approx(expected)
    assert len(set(local.offsets.tolist())) > 1  # the starts differ


def test_a_steps_time_between_its_phases_is_replayed_with_its_data(tmp_path):
    """The loop's own work between a step's phases (the row's record, the hooks) is a
    step's time as much as its phases: rows whose starts lie 0.1 ms beyond their phases
    replay 0.1 ms more data; an evaluation's pause (longer than the step's phases) and
    the last row, which has no next start, take the rank's median; ssgd's simulated
    steps get that much longer."""
    from syncbench.analysis.runfile import read_run
    from syncbench.bench.simulate.workload import between_phases

    _write_measured_run(tmp_path / "plain.h5")
    plain = from_run(str(tmp_path / "plain.h5"))
    extra = np.full(30, 1e-4)
    extra[[5, 11]] = [2e-4, 5e-2]  # a longer row, and an evaluation between steps 11, 12
    _write_measured_run(tmp_path / "gaps.h5", between=extra)
    gaps = between_phases(read_run(str(tmp_path / "gaps.h5")).ranks[0])
    assert gaps[5] == pytest.approx(2e-4) and gaps[4] == pytest.approx(1e-4)
    assert gaps[11] == pytest.approx(1e-4) and gaps[29] == pytest.approx(1e-4)
    assert between_phases({"t_start": np.zeros(1), "t_compute": np.ones(1)}) == [0.0]
    w = from_run(str(tmp_path / "gaps.h5"))
    expected = np.delete(np.where(extra > 1e-2, 1e-4, extra), [0, 1])
    assert w.rows[:28, 0] - plain.rows[:28, 0] == pytest.approx(expected)
    assert w.rows[:, 1:] == pytest.approx(plain.rows[:, 1:])
    cfg = config("--algorithm", "ssgd", "--comm", "blocking")
    spans = []
    for workload in (plain, w):
        local = LocalTimes(workload, 2, [1.0] * 2, Stragglers(), seed=0)
        rows = rows_of(strategies.ssgd(cfg, local, 20, every_phase(1e-6)))
        spans.append(rows[0]["t_start"][-1] - rows[0]["t_start"][0])
    assert spans[1] - spans[0] == pytest.approx(19 * 1e-4, rel=0.15)


def test_a_slow_measured_rank_stays_slow_in_the_simulated_ssgd(tmp_path):
    path = tmp_path / "measured.h5"
    _write_measured_run(path)
    w = from_run(str(path))
    local = LocalTimes(w, 4, [1.0] * 4, Stragglers(), seed=0)
    timeline = strategies.ssgd(config("--algorithm", "ssgd", "--comm", "blocking"), local, 40,
                               every_phase(1e-6))
    rows = rows_of(timeline)
    for k in (1, 3):
        assert np.all(rows[k]["t_delay"] > 2e-3) and np.all(rows[k]["t_comm"] < 1e-3)
    for k in (0, 2):
        assert np.all(rows[k]["t_delay"] == 0) and np.all(rows[k]["t_comm"] > 2e-3)


def test_stragglers_never_speed_a_step_up_and_the_transient_median_is_its_own():
    rng = np.random.default_rng(1)
    every = delay_factors(parse_stragglers("lognormal:0.5"), np.ones(500), rng, (500, 200))
    assert every.min() >= 1.0
    assert np.median(every) == pytest.approx(math.exp(0.6745 * 0.5), rel=0.02)
    transient = delay_factors(parse_stragglers("1/4:lognormal:0.5"), np.ones(500), rng,
                              (500, 400))
    hit = transient[transient > 1]
    assert 0.23 < hit.size / transient.size < 0.27
    assert np.median(hit) == pytest.approx(math.exp(0.6745 * 0.5), rel=0.03)
    none = delay_factors(parse_stragglers("1/4:lognormal:0"), np.ones(100), rng, (100, 50))
    assert np.all(none == 1.0)  # SIGMA 0: no slowdown at all (1 + lognormal gave 2x)
    # the compute itself is never shrunk: a straggler only adds delay
    split = ComputeSplit(forward=(0.5,), backward=(1.0,), offsets=(0,))
    local = LocalTimes(fixed_workload(10, split), 64, [1.0] * 64,
                       parse_stragglers("lognormal:1"), seed=0)
    local.ensure(50)
    assert np.all(local.cols[..., 1] == 1.0) and local.cols[..., 3].min() >= 0.0


def test_lenet_buckets_are_posted_at_the_hooks_the_code_posts_them():
    """The simulator's split of lenet has the hook calls of Model.loss_and_grad, and its
    hook plan makes the posts, polls and delay that BucketedIallreduce.on_grads_ready makes."""
    from syncbench.algorithms.reducers.bucketed import BucketedIallreduce
    from syncbench.kernels.zoo import build_model

    w = from_profile("lenet")
    split = w.compute_split()
    model = build_model("lenet", (1, 28, 28), 10)
    assert len(split.forward) == len(split.backward) == len(model.layers) == 12
    plan = strategies.bucket_plan(w, "auto")
    assert plan == [(50692, 61706), (2572, 50692), (0, 2572)]

    events, reported = [], []
    core = SimpleNamespace(straggle=lambda: events.append(("delay", len(reported) - 1)),
                           model=SimpleNamespace(grads=np.zeros(model.size)),
                           comm=SimpleNamespace(
                               Iallreduce=lambda buf: events.append(("post", len(reported) - 1)),
                               poll=lambda: events.append(("poll", len(reported) - 1))))
    reducer = BucketedIallreduce(core, plan)
    reducer.start()

    def on_grads_ready(offset: int) -> None:
        reported.append(offset)
        reducer.on_grads_ready(offset)

    x, y = np.zeros((2, 1, 28, 28), np.float32), np.zeros(2, np.int64)
    model.loss_and_grad(x, y, on_grads_ready=on_grads_ready)
    assert tuple(reported) == split.offsets
    hooks = strategies.hook_plan(plan, split.offsets)
    posts = [("post", h) for h, b in enumerate(hooks.posts) for _ in b]
    assert [e for e in events if e[0] == "post"] == posts == [("post", 2), ("post", 4),
                                                            ("post", 11)]
    assert [e for e in events if e[0] == "delay"] == [("delay", hooks.straggle)]
    # before the first post Communicator.poll has nothing to test: no Testall there
    assert [h for kind, h in events if kind == "poll" and h > 2] == list(hooks.polls)
    # the posts' places in the compute, from lenet's FLOPs (forward 0.370 of a step):
    # after the backward of Linear(84,10) and Linear(120,84) (the first bucket) and of
    # Linear(400,120) (the second), not at 45% and 97% of the compute as 50 equal
    # layers over the last 2/3 of it had them
    mac = {"c1": 6 * 28 * 28 * 25, "c2": 16 * 10 * 10 * 150, "f1": 400 * 120, "f2": 120 * 84,
           "f3": 84 * 10}
    bias = {"c1": 6 * 28 * 28, "c2": 16 * 10 * 10, "f1": 120, "f2": 84, "f3": 10}
    fwd = {k: 2 * mac[k] + bias[k] for k in mac}
    elementwise = 2 * (6 * 28 * 28 + 6 * 28 * 28 + 16 * 10 * 10 + 16 * 10 * 10 + 120 + 84)
    bwd = {k: fwd[k] + (2 * mac[k] if k != "c1" else 0) for k in mac}
    total = sum(fwd.values()) + sum(bwd.values()) + elementwise + 50
    before = sum(fwd.values()) + elementwise / 2 + 50
    first = (before + bwd["f3"] + 84 + bwd["f2"]) / total
    second = (before + bwd["f3"] + bwd["f2"] + 84 + 120 + bwd["f1"]) / total
    assert split.backward[2] == pytest.approx(first, rel=1e-9)
    assert split.backward[4] == pytest.approx(second, rel=1e-9)
    assert split.backward[11] == 1.0 and 0.36 < split.forward[-1] < 0.38


def test_lenet_ssgd_overlap_posts_its_buckets_where_backward_finishes_them(free_polls):
    """With 2-stage buckets of 0.03 s on 2 ranks and a 1 s step, the first bucket is
    done long before the last is posted, and the wait is the last bucket's 0.06 s (the
    middle one, ready at 47% of the compute, has 0.5 s to finish). Over TCP, where a
    progress call moves one 64 KiB segment of a flow, the middle one (192 KB: each
    stage's 96 KB flow two segments of 0.015 s) runs its first segment at once, its
    second at the poll at 89%, and the Wait runs the other two before the last bucket:
    0.09 s."""
    w = from_profile("lenet")
    w.mean_compute_s, w.cv, w.mean_data_s, w.mean_update_s = 1.0, 0.0, 0.0, 0.0
    local = LocalTimes(w, 2, [1.0, 1.0], Stragglers(), seed=0)
    timeline = strategies.ssgd(config("--algorithm", "ssgd"), local, 2, every_phase(0.03))
    assert rows_of(timeline)[0]["t_wait"] == pytest.approx([0.06, 0.06])
    from syncbench.bench.simulate.collectives import PlacedClock
    from syncbench.bench.simulate.progress import PROGRESS_SEGMENT_BYTES

    tcp = PlacedClock(every_phase(0.03), 1, 0.0, PROGRESS_SEGMENT_BYTES)
    local = LocalTimes(w, 2, [1.0, 1.0], Stragglers(), seed=0)
    timeline = strategies.ssgd(config("--algorithm", "ssgd"), local, 2, tcp)
    assert rows_of(timeline)[0]["t_wait"] == pytest.approx([0.09, 0.09])


def test_a_validated_runs_hook_calls_are_timed_on_this_host_and_flops_on_request(tmp_path):
    """``--compute-split auto`` times where a measured run's hook calls fall under
    ``--validate`` (the runs were made on this host): the model's own ``loss_and_grad``,
    each call's share of its step, in call order, the last backward call at 1, the FLOP
    split's gradient offsets; without ``--validate``, or with ``--compute-split flops``,
    the FLOP split. A profile keeps its split."""
    from syncbench.bench.simulate.inputs import build_workload
    from syncbench.bench.simulate.workload import model_split, timed_split, with_timed_split
    from syncbench.kernels.zoo import build_model as zoo

    path = tmp_path / "measured.h5"
    _write_measured_run(path)
    flops = model_split(zoo("mlp", (784,), 10))
    timed = timed_split("mlp", "fashion-mnist", 64)
    assert timed is not None and timed.source.startswith("timed on this host")
    assert len(timed.hooks) == len(flops.hooks) and timed.offsets == flops.offsets
    assert np.all(np.diff(timed.hooks) >= 0) and timed.hooks[-1] == 1.0
    assert 0.0 <= timed.hooks[0] < 0.5 < timed.hooks[-2]  # a forward call, a late backward
    for flags, split in ((["--validate", str(path)], timed),
                         (["--validate", str(path), "--compute-split", "flops"], flops),
                         ([], flops), (["--compute-split", "timed"], timed)):
        w = build_workload(config("--workload", str(path), *flags))
        assert w.compute_split().hooks.tolist() == split.hooks.tolist(), flags
    profile = build_workload(config("--workload", "lenet", "--compute-split", "timed"))
    assert not profile.compute_split().source.startswith("timed")
    bare = dataclasses.replace(profile, split=None)  # a paper profile: no model to time
    assert with_timed_split(bare) is bare
    with pytest.raises(SystemExit):
        config("--compute-split", "measured")


def test_a_split_is_not_timed_for_a_gpu_run_or_steps_too_long_to_time(tmp_path, capsys):
    """The host times its own CPU's layers: a run computed with CuPy keeps the FLOP split,
    and so does one whose untimed and fewest timed steps would not fit the budget (a
    large model's minutes a step); ``--compute-split timed`` says so in one line."""
    from syncbench.bench.simulate.inputs import build_workload
    from syncbench.bench.simulate.workload import (
        SPLIT_BUDGET_S,
        timed_split_refusal,
        with_timed_split,
    )

    path = tmp_path / "measured.h5"
    _write_measured_run(path)
    w = from_run(str(path))
    assert timed_split_refusal(w) is None
    gpu = dataclasses.replace(w, extra={**w.extra, "backend": "cupy"})
    assert "cupy" in timed_split_refusal(gpu) and with_timed_split(gpu) is gpu
    rows = w.rows.copy()
    rows[:, 1] = SPLIT_BUDGET_S
    slow = dataclasses.replace(w, rows=rows)
    assert "too long" in timed_split_refusal(slow) and with_timed_split(slow) is slow
    build_workload(config("--workload", str(path), "--batch-size", "640000",
                          "--compute-split", "timed"))
    assert "--compute-split timed: its steps" in capsys.readouterr().out
