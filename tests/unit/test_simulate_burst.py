"""A token bucket on the links (``simulate --link-burst``, ``collectives.burst_stages``):
a blocking collective after compute sends its first bytes at once, not its latency."""

from __future__ import annotations

import numpy as np
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


# -- nonblocking collectives: 64 KiB a progress call, and the bucket on their segments ------

def test_a_nonblocking_allreduce_stage_moves_64_kib_a_progress_call():
    """Measured across 2 emulated nodes (``python -m syncbench.bench.micro.polls --op
    iallreduce``, both ranks polling 1-4 ms apart): 940 KB took 17-18 polls whatever the
    gap, 16 KB 3-4: a flow moves one 64 KiB segment per progress call. Each stage of
    :func:`allreduce_stages` is cut into such segments, its time shared among them."""
    import math

    from syncbench.bench.simulate.progress import (
        PROGRESS_SEGMENT_BYTES,
        allreduce_stage_bytes,
        allreduce_stages,
    )

    phases = allreduce_phases(940_000, 2, "auto", nonblocking=True)
    tcp = PlacedClock(wire, 1, 0.0, PROGRESS_SEGMENT_BYTES)  # a --calibrate'd platform's
    stages = allreduce_stages(940_000, 2, "auto", tcp)
    sizes = allreduce_stage_bytes(940_000, 2, "auto", tcp)
    parts = [math.ceil(p.nbytes / PROGRESS_SEGMENT_BYTES) for p in phases]
    assert len(stages) == len(sizes) == sum(p.repeat * k for p, k in zip(phases, parts))
    assert sum(stages) == pytest.approx(sum(wire(p) * p.repeat for p in phases))
    assert sum(sizes) == pytest.approx(sum(p.nbytes * p.repeat for p in phases))
    assert max(sizes) <= PROGRESS_SEGMENT_BYTES and len(stages) >= 15
    # RDMA (a modelled platform, no segment): one stage per phase step, as before
    assert len(allreduce_stages(940_000, 2, "auto", wire)) == sum(p.repeat for p in phases)


def test_the_wire_passes_the_buckets_bytes_at_once_and_refills_it_while_idle():
    from syncbench.bench.simulate.progress import Wire

    wire_ = Wire(burst=100_000, rate=1e8)  # full at the start
    seconds, credit = wire_.durations(np.array([1e-3, 1e-3]), np.array([65536.0, 65536.0]),
                                      start=0.0)
    assert seconds == pytest.approx([1e-3 - 65536 / 1e8, 1e-3 - 34464 / 1e8])
    assert credit == pytest.approx([34464, 0])
    wire_.credit, wire_.free_at = 0.0, 2e-3
    # idle 0.5 ms: 50 KB back, of which the next segment sends all at once
    seconds, credit = wire_.durations(np.array([1e-3]), np.array([65536.0]), start=2.5e-3)
    assert seconds == pytest.approx([1e-3 - 50_000 / 1e8]) and credit == pytest.approx([0])
    # no bucket, or no byte counts: the stages' own seconds
    assert Wire().durations(np.array([1e-3]), np.array([65536.0]), 0.0)[0] == \
        pytest.approx([1e-3])


def test_a_frozen_rank_moves_no_segment_of_an_overlapped_bucket_while_a_slowed_one_does():
    """SSGD overlap, rank 1 at half speed: as a 2x slowdown in work mode its delay runs the
    model's passes and polls, and the buckets' segments move in it; as a node at speed 0.5
    its delay is frozen (a quota's), polls nothing, and what is left waits for the
    ``Waitall``: a longer wait."""
    cfg = build_parser("simulate").parse_args(["simulate", "--algorithm", "ssgd",
                                               "--bucket-mb", "0.2"])
    w = Workload(name="test", params=200_000, batch_size=1, dataset_samples=1000,
                 mean_compute_s=0.02, mean_update_s=0.0,
                 split=ComputeSplit(forward=(0.1, 0.2, 0.3, 0.4),
                                    backward=(0.5, 0.6, 0.7, 0.8, 0.9, 1.0),
                                    offsets=(0, 50_000, 100_000, 150_000)))

    from syncbench.bench.simulate.progress import PROGRESS_SEGMENT_BYTES

    def wait(speeds):
        local = LocalTimes(w, 2, [1.0, 2.0], Stragglers(), seed=0, speeds=speeds)
        tcp = PlacedClock(wire, 1, 0.0, PROGRESS_SEGMENT_BYTES)
        rows = strategies.ssgd(cfg, local, 4, tcp).rows.arrays()
        return float(np.mean(rows[0]["t_wait"]))

    assert wait([1.0, 0.5]) > wait(None) + 1e-3
