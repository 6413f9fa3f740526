"""Simulated ASGD traffic (``bench/simulate/asgd.py``): the code's epochs, counter and accumulates.

The traffic of ``algorithms/asgd.py``: one RMA epoch per owner in every pull
and push, four round trips and five atomics per step on rank 0's counter
(served one at a time), the owners' accumulate rate, and the staleness
bounds as the code reads them. The pure parts run without SimGrid; the
command-line tests skip without it (unless ``SYNCBENCH_REQUIRE_SIMGRID``).

Split off this module: ``tests/e2e/test_simulate_asgd_e2e.py`` (its tests that launch a
process or start MPI).
"""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.bench.simulate.asgd import (
    COUNTER_ATOMICS,
    RmaCosts,
    access_seconds,
    accumulate_seconds,
    calibrate_rma,
    counter_bound,
    counter_timeline,
    epochs_per_access,
)

# -- one epoch per owner ---------------------------------------------------------------------

def test_a_pull_is_one_epoch_per_owner_and_their_overheads_add_up():
    # the code's shard_layout: N owners when sharded, rank 0 alone otherwise
    assert epochs_per_access(235146, 16384, "sharded") == 16384
    assert epochs_per_access(235146, 16384, "single") == 1
    nocheck = RmaCosts(epoch_s=2e-6)
    one_way, bw = 4e-6, 80e-6
    # tiny model, many owners: the origin's serial per-owner work decides
    grow = access_seconds(1024, one_way, bw, nocheck) - access_seconds(256, one_way, bw, nocheck)
    assert grow == pytest.approx(768 * 2e-6)
    # without MPI_MODE_NOCHECK every owner's Lock and Unlock is a round trip of its own
    none = RmaCosts(epoch_s=2e-6, nocheck=False)
    grow = access_seconds(1024, one_way, bw, none) - access_seconds(256, one_way, bw, none)
    assert grow == pytest.approx(768 * (2e-6 + 2 * 2 * one_way))
    # few owners, large model: the bytes' time, plus the reply's latency
    assert access_seconds(2, one_way, 0.5, nocheck) == pytest.approx(0.5 + one_way)


# -- the counter at rank 0 -------------------------------------------------------------------

def test_the_counter_serialises_every_step_at_rank_0():
    # Free workers and windows: rank 0's queue alone sets the pace.
    workers, total, service = 64, 640, 1e-6
    run = counter_timeline(list(range(workers)), total, 0.0, 0.0, lambda k, j: (0, 0, 0, 0),
                           [0.0] * workers, RmaCosts(epoch_s=0.0, service_s=service))
    assert len(run.step) == total and run.version == total and run.started == total
    assert run.claims == total + workers  # a first ticket each, then one per push
    # W first claims, then 5 atomics per step, back to back
    assert run.wall_s == pytest.approx((workers + COUNTER_ATOMICS * total) * service)
    assert total / run.wall_s <= counter_bound(service) == pytest.approx(1 / (5 * service))
    assert run.busy_s == pytest.approx(run.wall_s)
    # Four round trips per step: with latency and no queue they add up per worker.
    one = counter_timeline([0, 1], 4, 0.0, 0.0, lambda k, j: (0, 0, 0, 0), [0.0, 1e-3],
                           RmaCosts(epoch_s=0.0, service_s=0.0))
    steps_of_1 = int((one.worker == 1).sum())
    assert one.cols["t_comm"][one.worker == 1] == pytest.approx([4 * 2e-3] * steps_of_1)


# -- the owners' accumulate rate -------------------------------------------------------------

def test_the_accumulate_rate_bounds_the_push():
    # alone: each of E owners reduces P/E bytes
    assert accumulate_seconds(1e6, 4, 1, 1e9, think_s=1.0) == pytest.approx(1e6 / 4e9)
    # saturated owners: W pushes per cycle share them (closed loop: W b - the rest)
    assert accumulate_seconds(1e6, 1, 100, 1e9, think_s=0.01) == pytest.approx(0.1 - 0.01)
    costs = RmaCosts(epoch_s=0.0)
    assert access_seconds(1, 1e-6, 1e-4, costs, reduce_s=0.05) == pytest.approx(0.05 + 2e-6)


def test_calibrate_rma_fits_the_rate_of_comm_results(tmp_path):
    from syncbench.bench.micro.comm import write_results

    sizes = [4 << i for i in range(21)]
    rows = [{"size": s, "avg_us": (10e-6 + s / 2e9) * 1e6, "p50_us": (10e-6 + s / 2e9) * 1e6}
            for s in sizes]
    path = str(tmp_path / "acc.h5")
    write_results(path, {"op": "rma-accumulate", "world_size": 2}, rows, [])
    rate, details = calibrate_rma(path)
    assert rate == pytest.approx(2e9, rel=0.01)
    assert details["latency_s"] == pytest.approx(10e-6, rel=0.05)
    write_results(path, {"op": "allreduce", "world_size": 2}, rows, [])
    with pytest.raises(ValueError, match="rma-accumulate"):
        calibrate_rma(path)


# -- staleness as the code counts it -----------------------------------------------------------

def test_staleness_min_counts_started_pushes_not_landed_ones():
    # Two workers, no latency or service; pull and push take 1 s, worker 0 computes
    # 1 s and worker 1 2.5 s; 4 pushes. By hand (times of rank 0's service):
    #   w0 step 0: pull 0-1 (v_pre 0, s_post 0), started++ at 2, version 0 -> 1 at 3
    #   w1 step 0: pull 0-1 (v_pre 0, s_post 0), started++ at 3.5, version 1 -> 2 at 4.5
    #   w0 step 1: pull 3-4 (v_pre 1, s_post 2), started++ at 5, version 2 -> 3 at 6
    #   w1 step 1: pull 4.5-5.5 (v_pre 2, s_post 3), started++ at 8, version 3 -> 4 at 9
    # w0's step 1: w1's push landed at 4.5, after w0's pull ended (4), but it had
    # started (3.5) before: it may be in w0's weights, so the lower bound is 0 (counting
    # landed pushes gave 1). Likewise w0's push landing at 6 for w1's step 1.
    compute = {0: 1.0, 1: 2.5}
    run = counter_timeline([0, 1], 4, 1.0, 1.0, lambda k, j: (0.0, compute[k], 0.0, 0.0),
                           [0.0, 0.0], RmaCosts(epoch_s=0.0, service_s=0.0))
    got = sorted(zip(run.worker.tolist(), run.step.tolist(), run.cols["t_start"].tolist(),
                     run.cols["staleness"].tolist(), run.cols["staleness_min"].tolist()))
    assert got == [(0, 0, 0.0, 0, 0), (0, 1, 3.0, 1, 0), (1, 0, 0.0, 1, 1), (1, 1, 4.5, 1, 0)]
    assert run.wall_s == pytest.approx(9.0)
    assert np.all(run.cols["t_comm"] == pytest.approx(2.0))  # pull 1 + push 1, no waiting
    assert run.started == run.version == 4


# -- 16,384 ranks ---------------------------------------------------------------------------


# -- the targets serve at their polls --------------------------------------------------------

def test_a_request_waits_for_the_targets_next_poll():
    """One gap g outside MPI all the time: half of it on average; outside a share f of
    the cycle: f g / 2; two owners: the larger of two waits, 2/3 g; polls closer than
    ProgressPoll's 0.5 ms gap are one."""
    from syncbench.bench.simulate.asgd import poll_gaps, target_wait

    assert target_wait(np.array([0.01]), 1.0) == pytest.approx(0.005, rel=1e-3)
    assert target_wait(np.array([0.01]), 0.5) == pytest.approx(0.0025, rel=1e-3)
    assert target_wait(np.array([0.01]), 1.0, owners=2) == pytest.approx(0.01 * 2 / 3, rel=1e-3)
    # unequal gaps: a request more likely falls in the long one (sum g^2 / 2 sum g)
    assert target_wait(np.array([0.009, 0.001]), 1.0) == pytest.approx(
        (0.009 ** 2 + 0.001 ** 2) / (2 * 0.01), rel=1e-3)
    gaps = poll_gaps(0.001, 0.010, 0.002, 0.0, [0.5, 0.52, 1.0])
    np.testing.assert_allclose(gaps, [0.006, 0.005, 0.002])  # data + half, the rest, update
    # a delay (an emulated slowdown) polls as compute does: here a pass and a half more
    gaps = poll_gaps(0.001, 0.010, 0.002, 0.015, [0.5, 0.52, 1.0])
    np.testing.assert_allclose(gaps, [0.006, 0.005, 0.005, 0.005, 0.005, 0.002])
    # a delay of which a quota's freezes (no polls) are the last 8 ms: 7 ms polled, the
    # first check past it (at 21 ms) polls at 18 ms, then one gap to the step's end
    gaps = poll_gaps(0.001, 0.010, 0.002, 0.015, [0.5, 0.52, 1.0], polled=0.007)
    np.testing.assert_allclose(gaps, [0.006, 0.005, 0.005, 0.002, 0.010])
    # a node quota at speed 0.5 (stretch 2): its freezes fall between the hooks, which
    # spread over the 20 ms of stretched compute; its 10 ms leave the delay
    gaps = poll_gaps(0.001, 0.010, 0.002, 0.010, [0.5, 0.52, 1.0], polled=0.0, stretch=2.0)
    np.testing.assert_allclose(gaps, [0.011, 0.010, 0.002])
    # a quota and a 1.5x slowdown (delay 0.005 x 2 + 0.010): the slowdown's 5 ms polls
    # as 10 ms at the quota, its passes as long as the stretched compute
    gaps = poll_gaps(0.001, 0.010, 0.002, 0.020, [0.5, 0.52, 1.0], polled=0.005, stretch=2.0)
    np.testing.assert_allclose(gaps, [0.011, 0.010, 0.010, 0.002])


def test_asgd_pays_its_targets_polls_over_tcp_and_not_with_immediate_progress():
    """2 ranks, sharded: each pull and push waits for the other owner's poll, and rank
    1's four counter requests per step for rank 0's; --rma-progress immediate keeps the
    old model. The simulated sync grows by a few waits per step."""
    from syncbench.bench.cli import build_parser
    from syncbench.bench.simulate import strategies
    from syncbench.bench.simulate.timeline import LocalTimes
    from syncbench.bench.simulate.workload import ComputeSplit, Stragglers, Workload

    split = ComputeSplit(forward=(0.5,), backward=(1.0,), offsets=(0,))
    w = Workload(name="test", params=1000, batch_size=1, dataset_samples=1000,
                 mean_compute_s=0.01, split=split)

    def sync_per_step(progress: str) -> float:
        cfg = build_parser("simulate").parse_args(
            ["simulate", "--algorithm", "asgd", "--rma-progress", progress])
        local = LocalTimes(w, 2, [1.0, 1.0], Stragglers(), seed=0)
        rows = strategies.SIMULATORS["asgd"](cfg, local, 20, lambda phase: 1e-5).rows.arrays()
        return float(np.mean(np.concatenate([r["t_comm"] for r in rows.values()])))

    polls, immediate = sync_per_step("polls"), sync_per_step("immediate")
    # 2.5 ms waits (two 5 ms gaps): about two a step once the pair's connection orders
    # rank 1's counter requests behind rank 0's reads (4.6 ms a step; 7.6 before)
    assert polls > immediate + 0.004


def test_an_asgd_owner_does_not_poll_in_its_slowdowns_delay():
    """ASGD's drive_progress is NotLockStep's no-op, so a worker slowed 2x serves no
    request in its delay (unlike AD-PSGD's passive rank): its owner waits grow with the
    delay, one unpolled gap as long as the compute."""
    from syncbench.bench.cli import build_parser
    from syncbench.bench.simulate import strategies
    from syncbench.bench.simulate.timeline import LocalTimes
    from syncbench.bench.simulate.workload import ComputeSplit, Stragglers, Workload

    split = ComputeSplit(forward=(0.5,), backward=(1.0,), offsets=(0,))
    w = Workload(name="test", params=1000, batch_size=1, dataset_samples=1000,
                 mean_compute_s=0.01, split=split)

    def owner_wait(slowdown: list[float]) -> float:
        cfg = build_parser("simulate").parse_args(
            ["simulate", "--algorithm", "asgd", "--rma-progress", "polls"])
        local = LocalTimes(w, 2, slowdown, Stragglers(), seed=0)
        timeline = strategies.SIMULATORS["asgd"](cfg, local, 20, lambda phase: 1e-5)
        return float(timeline.notes["owner_poll_wait_s"])

    assert owner_wait([2.0, 2.0]) > 1.5 * owner_wait([1.0, 1.0])


def test_an_origin_waits_for_its_own_owners_gaps_not_the_workers_mean():
    """Two owners, sharded: each origin waits for the other's polls only. A slow owner
    (one 20 ms unpolled gap, outside MPI all the time) makes the fast origin wait
    20/2 = 10 ms and the slow origin the fast owner's 2 ms / 2; the mean of the two gap
    profiles would give both the same wait. Three owners: the largest of the others'."""
    from syncbench.bench.simulate.asgd import origin_waits, target_wait

    fast, slow = np.array([0.002]), np.array([0.020])
    waits = origin_waits([fast, slow], [1.0, 1.0], owners=[0, 1], origins=[0, 1])
    assert waits[0] == pytest.approx(0.010, rel=1e-2)
    assert waits[1] == pytest.approx(0.001, rel=1e-2)
    # a single owner (rank 0): its own accesses are local, the others wait for its polls
    assert origin_waits([fast, slow], [1.0, 1.0], owners=[0], origins=[0, 1]) == \
        [0.0, pytest.approx(0.001, rel=1e-2)]
    # alike owners: target_wait's largest of m equal waits
    gaps = [fast, fast, fast]
    three = origin_waits(gaps, [0.5] * 3, owners=[0, 1, 2], origins=[0, 1, 2])
    assert three == [pytest.approx(target_wait(fast, 0.5, owners=2), rel=1e-3)] * 3


class _StandInClock:
    """A phase clock: ``transfer_s`` for any payload, 10 us for a counter message, and the
    links' token bucket of ``burst`` bytes (``collectives.burst_of``)."""

    def __init__(self, transfer_s: float, burst: float = 0.0) -> None:
        self.transfer_s, self.burst = transfer_s, burst

    def __call__(self, phase) -> float:
        return self.transfer_s if phase.nbytes > 8 else 1e-5


def _resnet8_like_asgd(slowdown: list[float], monkeypatch=None, event_max: int | None = None,
                       speeds: list[float] | None = None):
    """2 ranks, sharded, a workload like resnet8's on the emulated cluster: 27 ms of compute
    polled at its layers' hooks (gaps of 2.7-7 ms), 75,002 parameters (146 KiB a shard: a
    push needs 3 of its owner's polls), 1 ms a transfer, the links' 256 KB token bucket
    (1 Gbit/s: a shard leaves at once after an idle spell). ``event_max`` 0: the
    mean-field waits (what the simulator did before it followed the polls). ``speeds``:
    each rank's node quota, as the simulator passes it (``slowdown`` then holds ``1 /
    speed``)."""
    from syncbench.bench.cli import build_parser
    from syncbench.bench.simulate import asgd as asgd_model
    from syncbench.bench.simulate import strategies
    from syncbench.bench.simulate.timeline import LocalTimes
    from syncbench.bench.simulate.workload import ComputeSplit, Stragglers, Workload

    if event_max is not None:
        monkeypatch.setattr(asgd_model, "POLLS_EVENT_MAX", event_max)
    split = ComputeSplit(forward=(0.14, 0.24, 0.34), backward=(0.53, 0.73, 0.99, 1.0),
                         offsets=(0,))
    w = Workload(name="test", params=75002, batch_size=1, dataset_samples=1000,
                 mean_compute_s=0.027, split=split)
    cfg = build_parser("simulate").parse_args(
        ["simulate", "--algorithm", "asgd", "--rma-progress", "polls"])
    local = LocalTimes(w, 2, slowdown, Stragglers(), seed=0, speeds=speeds)
    rows = strategies.SIMULATORS["asgd"](cfg, local, 40, _StandInClock(1e-3, 256e3)).rows.arrays()
    comm = [float(np.mean(rows[k]["t_comm"])) for k in (0, 1)]
    step = [float(np.median(np.diff(rows[k]["t_start"]))) for k in (0, 1)]
    starts, phases = rows[0]["t_start"], []
    for t in rows[1]["t_start"][5:]:  # where in rank 0's cycle each step of rank 1 begins
        i = int(np.searchsorted(starts, t)) - 1
        if 0 <= i < len(starts) - 1:
            phases.append((t - starts[i]) / (starts[i + 1] - starts[i]))
    phases = np.asarray(phases)
    return comm, step, float(np.mean((phases < 0.1) | (phases > 0.9)))


def test_an_accumulate_takes_one_poll_of_its_owner_per_segment_and_a_read_one():
    """Measured on 2 emulated nodes (the owner spinning between Iprobes 2 or 4 ms apart):
    an Accumulate of 16 KB took 1 poll, 64 KiB 2, 155 KB 3, 459 KiB 8-9; reads 1."""
    from syncbench.bench.simulate.asgd import push_polls, served_at

    assert [push_polls(b) for b in (16384, 65536, 158720, 470000)] == [1, 2, 3, 8]
    span = (0.0, 0.020, [0.005, 0.010, 0.015])  # outside MPI for 20 ms, polls every 5
    assert served_at(span, 0.021) == (0.021, 0.0)  # in MPI: at once
    assert served_at(span, 0.002) == (0.005, 0.0)  # a read: the next poll
    assert served_at(span, 0.002, need=3) == (0.015, 0.0)  # three polls
    # two of the four polls it needs before the span ends: served when the owner enters
    # MPI, half of the bytes still to move (one of four: three quarters)
    assert served_at(span, 0.006, need=4) == (0.020, pytest.approx(0.5))
    assert served_at(span, 0.011, need=4) == (0.020, pytest.approx(0.75))


def test_two_alike_asgd_ranks_lock_into_one_phase(monkeypatch):
    """Measured (resnet8, 2 emulated nodes at 1 Gbit/s, 3 runs): every step of rank 1 began
    within a tenth of a cycle of a step of rank 0, and rank 1's sync was 4.3-5.3 ms a step.
    Followed request by request, an origin that waits for its owner leaves with it, so the
    two serve each other in their accesses; independent phases (the mean-field residual of
    rank 0's gaps for each of rank 1's six requests) kept them apart and gave rank 1
    about 15 ms."""
    comm, step, locked = _resnet8_like_asgd([1.0, 1.0])
    assert locked >= 0.9
    assert step[1] == pytest.approx(step[0], rel=0.02)
    assert max(comm) < 0.008
    mean_comm, _, mean_locked = _resnet8_like_asgd([1.0, 1.0], monkeypatch, event_max=0)
    assert comm[1] < 0.6 * mean_comm[1] and mean_locked < 0.5


def test_a_fast_asgd_rank_locks_to_a_slow_owner_whose_pushes_need_its_polls(monkeypatch):
    """Rank 1 2x slower in work mode (its 27 ms delay unpolled): rank 0's pushes need 3 of
    rank 1's polls, so they end when rank 1 enters MPI, and both step at the slow pace; the
    slow rank finds the fast one waiting in MPI and barely waits. Measured (resnet8, 1
    Gbit/s, work mode): 54.6 and 54.5 ms a step, sync 27.8 ms on the fast rank and 3.2 on
    the slow one; the mean-field waits gave 15 and 12 ms and steps apart."""
    comm, step, locked = _resnet8_like_asgd([1.0, 2.0])
    assert locked >= 0.9 and step[0] == pytest.approx(step[1], rel=0.02)
    assert comm[0] > 0.8 * 0.027 and comm[0] > 4 * comm[1]
    mean_comm, mean_step, _ = _resnet8_like_asgd([1.0, 2.0], monkeypatch, event_max=0)
    assert mean_step[0] < 0.8 * mean_step[1]


def test_a_free_asgd_rank_keeps_its_pace_beside_a_throttled_owner_that_polls_through_its_quota():
    """Rank 1's node at speed 0.5 (a 1 ms quota every 2 ms): the quota freezes it a
    millisecond at a time, so its compute's hooks still poll, spread over the stretched
    compute, and the free rank is served within a few of them. Measured (resnet8, 2
    emulated nodes at 1 Gbit/s, 2 runs): the free rank made 59-60 steps to the throttled
    rank's 32-33 (59.4-59.6 ms a step against 106.7-112.6), waiting 26.7-28.6 ms a step.
    With the quota's part of the step as one delay after the compute, polled nowhere, the
    free rank waited for all of it and the two stepped together: 46 and 46 steps, the
    throughput 19-20% low (docs/RESULTS.md, "A quota's hooks poll")."""
    comm, step, _ = _resnet8_like_asgd([1.0, 2.0], speeds=[1.0, 0.5])
    assert step[1] > 1.3 * step[0], step  # unpolled: 59.5 ms each
    assert comm[0] < 0.5 * step[0], comm  # unpolled: the free rank waited 32.5 of 59.5 ms


def test_a_message_waits_behind_the_bytes_queued_on_its_connection_not_the_other_way():
    """One TCP stream a pair (MPICH's CH4 over UCX's TCP): a counter reply from rank 0 to
    rank 1 leaves after rank 0's push bytes queued to rank 1, not after bytes going the
    other way; the sender's token bucket passes its credit at once after an idle spell,
    so bytes that follow the spell hold the connection that much less, and bytes sent
    back to back find it empty."""
    from syncbench.bench.simulate.asgd import Polls, _Followed

    polls = Polls(hooks=(1.0,), owners=((1,), (0,)), conn_pull=0.004, conn_push=0.004,
                  bucket_s=0.002)
    follow = _Followed(polls, 2, [0.005, 0.005], [0.005, 0.005], 1e-5)
    assert follow.queue(0, 1, 0.010, 0.004) == 0.010  # 10 ms idle: 2 ms of credit
    assert follow.behind(0, 1, 0.011) == pytest.approx(0.012)  # behind the other 2 ms
    assert follow.behind(1, 0, 0.011) == 0.011  # the other direction is empty
    assert follow.queue(0, 1, 0.011, 0.004) == pytest.approx(0.012)  # queues, no credit
    assert follow.behind(0, 1, 0.013) == pytest.approx(0.016)
    plain = _Followed(Polls(hooks=(1.0,), owners=((1,), (0,))), 2, [0.005] * 2,
                      [0.005] * 2, 1e-5)
    plain.queue(0, 1, 0.0, 0.004)
    assert plain.behind(0, 1, 0.001) == 0.001  # connections not followed: no queue


def test_two_asgd_ranks_take_turns_on_their_connections_instead_of_sharing_them():
    """mlp at 1 Gbit/s on the emulated cluster: 235,146 parameters (470 KB a shard, 3.9 ms
    at the rate), 1.1 ms of compute, the links' 256 KB bucket. Followed request by request,
    each pair's connection carries the two ranks' pulls and pushes one after the other;
    the mean-field share charged every transfer for the other rank's crossing ones, 11.7
    ms of sync a step (measured: 7.2 ms on rank 0, the two ranks 172-178 steps a second;
    predicted 157, now 185). Without the bucket, rank 1's counter trips queue behind rank
    0's shards and the two keep two paces (measured with it: 150 and 84 steps; the model
    with it keeps them in one)."""
    from syncbench.bench.cli import build_parser
    from syncbench.bench.simulate import strategies
    from syncbench.bench.simulate.timeline import LocalTimes
    from syncbench.bench.simulate.workload import ComputeSplit, Stragglers, Workload

    class Clock(_StandInClock):
        def __call__(self, phase) -> float:
            return 1e-5 + (phase.nbytes / 120e6 if phase.nbytes > 8 else 0.0)

    split = ComputeSplit(forward=(0.2, 0.3, 0.35), backward=(0.7, 0.95, 1.0), offsets=(0,))
    w = Workload(name="test", params=235146, batch_size=1, dataset_samples=10000,
                 mean_compute_s=0.0011, split=split)
    cfg = build_parser("simulate").parse_args(
        ["simulate", "--algorithm", "asgd", "--rma-progress", "polls"])

    def run(burst: float):
        local = LocalTimes(w, 2, [1.0, 1.0], Stragglers(), seed=0)
        timeline = strategies.SIMULATORS["asgd"](cfg, local, 100, Clock(0.0, burst))
        rows = timeline.rows.arrays()
        steps = [len(rows[k]["t_comm"]) for k in (0, 1)]
        return steps, [float(np.mean(rows[k]["t_comm"])) for k in (0, 1)], timeline.wall_s

    steps, comm, wall = run(256e3)
    assert 200 / wall > 170, 200 / wall  # 157 steps a second with the share
    assert max(comm) < 0.0105, comm  # 11.7 ms with the share
    steps, comm, _ = run(0.0)
    assert steps[0] > 1.5 * steps[1] and comm[1] > 1.5 * comm[0], (steps, comm)


def test_a_throttled_owners_mean_field_gaps_spread_over_its_stretched_compute():
    """Above 64 workers an access waits for the mean-field residual of its owners' poll
    gaps (_rank_gaps). An owner at speed 0.5 polls between its quota's freezes: its hooks
    spread over twice its compute and the quota's part leaves its delay, as the followed
    polls have it; a free owner's gaps are unchanged."""
    from syncbench.bench.simulate.asgd import _rank_gaps, poll_gaps
    from syncbench.bench.simulate.timeline import LocalTimes
    from syncbench.bench.simulate.workload import ComputeSplit, Stragglers, Workload

    split = ComputeSplit(forward=(0.25, 0.5), backward=(0.75, 1.0), offsets=(0,))
    w = Workload(name="test", params=1000, batch_size=1, dataset_samples=1000,
                 mean_compute_s=0.01, split=split)
    local = LocalTimes(w, 2, [1.0, 2.0], Stragglers(), seed=0, speeds=[1.0, 0.5])
    local.ensure(16)
    _, gaps = _rank_gaps(local, [0, 1])
    hooks = w.compute_split().hooks
    for rank, stretch in ((0, 1.0), (1, 2.0)):
        key = [float(f"{x:.3g}") for x in local.cols[rank].mean(axis=0)]
        np.testing.assert_allclose(gaps[rank], poll_gaps(*key, hooks, polled=0.0,
                                                         stretch=stretch))
    frozen = poll_gaps(*[float(f"{x:.3g}") for x in local.cols[1].mean(axis=0)], hooks,
                       polled=0.0)
    assert gaps[1].max() < frozen.max()  # one frozen block after the compute: longer


def test_a_sharded_pull_shares_its_links_with_the_other_workers_pushes():
    """2 ranks, sharded, a bandwidth-bound link (every transfer 20 ms, compute 5 ms): the
    link from owner i to worker j carries j's pulls and i's pushes, so each transfer takes
    20 ms x (1 + the share of a cycle the other spends in the other kind), about 29 ms,
    not 20 (measured at 200 Mbit/s: 22 ms median, 42-55 ms at the 90th percentile)."""
    from syncbench.bench.cli import build_parser
    from syncbench.bench.simulate import strategies
    from syncbench.bench.simulate.asgd import cross_traffic
    from syncbench.bench.simulate.timeline import LocalTimes
    from syncbench.bench.simulate.workload import ComputeSplit, Stragglers, Workload

    assert cross_traffic(0.02, 0.02, 0.5, 0.25) == pytest.approx((0.025, 0.03))
    assert cross_traffic(1.0, 1.0, 5.0, 5.0) == pytest.approx((1.9, 1.9))  # capped
    split = ComputeSplit(forward=(0.5,), backward=(1.0,), offsets=(0,))
    w = Workload(name="test", params=1000, batch_size=1, dataset_samples=1000,
                 mean_compute_s=0.005, split=split)

    def clock(phase) -> float:  # a shard's transfer 20 ms, a counter message 10 us
        return 0.02 if phase.nbytes > 8 else 1e-5

    def comm_per_step(layout: str) -> float:
        cfg = build_parser("simulate").parse_args(
            ["simulate", "--algorithm", "asgd", "--rma-progress", "immediate",
             "--ps-layout", layout])
        local = LocalTimes(w, 2, [1.0, 1.0], Stragglers(), seed=0)
        rows = strategies.SIMULATORS["asgd"](cfg, local, 40, clock).rows.arrays()
        return float(np.mean(np.concatenate([r["t_comm"] for r in rows.values()])))

    shared = comm_per_step("sharded")
    assert 2 * 0.027 < shared < 2 * 0.031, shared  # T = 20 (1 + T / (5 + 2 T)): 29 ms


def test_a_computes_polls_follow_progress_polls_own_rate_limit():
    """``ProgressPoll`` enters MPI at a hook unless its own last ``Iprobe`` was under 0.5
    ms ago: the first hook of a compute polls (its last poll was a step ago), one 0.15 ms
    after it does not."""
    from syncbench.bench.simulate.asgd import poll_offsets

    assert poll_offsets(0.003, [0.1, 0.15, 0.5, 1.0]) == pytest.approx([3e-4, 1.5e-3, 3e-3])
    assert poll_offsets(0.0, [0.5, 1.0]) == pytest.approx([0.0])
