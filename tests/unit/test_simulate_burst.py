"""A token bucket on the links (``simulate --link-burst``, ``collectives.burst_stages``):
a blocking collective after compute sends its first bytes at once, not its latency."""

from __future__ import annotations

import pytest

from syncbench.bench.cli import build_parser
from syncbench.bench.simulate import strategies
from syncbench.bench.simulate.collectives import (
    PlacedClock,
    allreduce_phases,
    allreduce_time,
    burst_stages,
)
from syncbench.bench.simulate.run import link_burst
from syncbench.bench.simulate.timeline import LocalTimes
from syncbench.bench.simulate.workload import ComputeSplit, Stragglers, Workload

LATENCY, RATE = 20e-6, 120e6  # the emulated 1 Gbit/s link's calibration


def wire(phase):
    """A phase's seconds on an idle link: latency plus its flows' bytes at the rate (0 for
    no bytes, as the SimGrid network's clock gives it)."""
    return LATENCY + phase.nbytes / RATE if phase.nbytes > 0 else 0.0


def test_the_bucket_takes_its_bytes_off_the_first_stages_and_keeps_the_latency():
    nbytes = 940_000
    phases = allreduce_phases(nbytes, 2, "auto")
    plain = burst_stages(phases, wire, 0.0)
    assert plain == pytest.approx([wire(p) for p in phases for _ in range(p.repeat)])
    burst = 256 * 1024
    first = phases[0].nbytes
    assert first > burst  # the bucket runs dry inside the first stage
    shaped = burst_stages(phases, wire, burst)
    assert shaped[0] == pytest.approx(plain[0] - burst / RATE * (1 - 1 / first))
    assert shaped[1:] == pytest.approx(plain[1:])
    # a bucket larger than the whole collective leaves only the latencies (and a byte)
    assert burst_stages(phases, wire, 1e9) == pytest.approx([LATENCY] * len(plain), abs=1e-7)
    # a node-local phase crosses no shaped link: it spends no credit and keeps its time
    node_first = allreduce_phases(nbytes, 8, "auto", ranks_per_node=4)
    assert node_first[0].block > 0
    placed = burst_stages(node_first, wire, burst)
    local = sum(p.repeat for p in node_first[:1])
    assert placed[:local] == pytest.approx(burst_stages(node_first, wire, 0.0)[:local])
    assert sum(placed) < sum(burst_stages(node_first, wire, 0.0))
    clock = PlacedClock(wire, 1, burst)
    assert allreduce_time(nbytes, 2, "auto", clock) == pytest.approx(sum(shaped))


def test_blocking_ssgd_gains_the_bucket_every_step():
    cfg = build_parser("simulate").parse_args(["simulate", "--comm", "blocking"])
    w = Workload(name="test", params=235_000, batch_size=64, dataset_samples=1000,
                 mean_compute_s=4e-3, mean_update_s=0.0,
                 split=ComputeSplit(forward=(0.5,), backward=(1.0,), offsets=(0,)))
    walls = []
    for burst in (0.0, 256 * 1024):
        local = LocalTimes(w, 2, [1.0, 1.0], Stragglers(), seed=0)
        walls.append(strategies.ssgd(cfg, local, 5, PlacedClock(wire, 1, burst)).wall_s)
    assert walls[0] - walls[1] == pytest.approx(5 * 256 * 1024 / RATE, rel=1e-4)


def test_a_bucket_refills_only_as_long_as_the_links_were_idle():
    """Steps of 1 ms compute: the links idle 1 ms between two Allreduces refill
    1 ms x the rate (120 KB), not the whole 256 KB bucket, so each step after the first
    gains 1 ms, not 2.2 (measured, mlp at 1 Gbit/s, 1.5 ms between Allreduces: 6.2-6.4 ms
    an Allreduce against 5.7 predicted with the bucket full every step)."""
    cfg = build_parser("simulate").parse_args(["simulate", "--comm", "blocking"])
    w = Workload(name="test", params=235_000, batch_size=64, dataset_samples=1000,
                 mean_compute_s=1e-3, mean_update_s=0.0,
                 split=ComputeSplit(forward=(0.5,), backward=(1.0,), offsets=(0,)))
    burst, steps = 256 * 1024, 5
    walls = []
    for bucket in (0.0, burst):
        local = LocalTimes(w, 2, [1.0, 1.0], Stragglers(), seed=0)
        walls.append(strategies.ssgd(cfg, local, steps, PlacedClock(wire, 1, bucket)).wall_s)
    refill = 1e-3 * RATE  # bytes after 1 ms idle, to the KiB the credit is taken in
    gained = burst / RATE + (steps - 1) * (refill // 1024 * 1024) / RATE
    assert walls[0] - walls[1] == pytest.approx(gained, rel=1e-3)
    assert walls[0] - walls[1] < 0.6 * steps * burst / RATE


def test_a_full_bucket_is_whole_whatever_its_size():
    """A bucket that is not a whole number of KiB is given whole after a long idle spell
    (the credit of a partial one is taken to the KiB below)."""
    from syncbench.bench.simulate.collectives import RefilledAllreduce

    for burst in (1000.0, 100_000.0, 256 * 1024.0):
        clock = PlacedClock(wire, 1, burst)
        full = RefilledAllreduce(940_000, 2, "auto", clock)
        assert full() == pytest.approx(allreduce_time(940_000, 2, "auto", clock))
        assert full(0.0) == pytest.approx(allreduce_time(940_000, 2, "auto", clock, burst=0.0))


@pytest.mark.parametrize("value,expect", [(None, 0.0), ("0", 0.0), ("256kb", 262144.0),
                                          ("51kb", 52224.0), ("1000", 1000.0),
                                          (52224.0, 52224.0)])
def test_link_burst_takes_tc_sizes_or_bytes(value, expect):
    cfg = build_parser("simulate").parse_args(["simulate"])
    cfg.link_burst = value
    assert link_burst(cfg) == expect


@pytest.mark.parametrize("value", ["lots", "-5"])
def test_a_bad_link_burst_is_one_line(value):
    cfg = build_parser("simulate").parse_args(["simulate"])
    cfg.link_burst = value
    with pytest.raises(ValueError, match="--link-burst"):
        link_burst(cfg)
