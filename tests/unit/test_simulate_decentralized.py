"""The decentralized and hierarchical simulated patterns, without SimGrid (phase durations
given by a stand-in clock, so the expected instants are computed by hand).

``bench/simulate/decentralized.py`` (D-PSGD's gossip, AD-PSGD's pairwise averages) and
``bench/simulate/hierarchical.py`` (node and global averages, SSGD's hierarchical
allreduce). The bytes of the gossip against the real averager's buffers:
``tests/mpi_inproc/test_simulate_gossip_mpi.py``; the weak scaling on SimGrid:
``tests/e2e/test_simulate_decentralized_e2e.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.algorithms.graphs import build_graph
from syncbench.bench.cli import build_parser
from syncbench.bench.simulate import strategies
from syncbench.bench.simulate.collectives import PlacedClock, allreduce_phases
from syncbench.bench.simulate.decentralized import (
    COPY_SHARE,
    Adjacency,
    PairsPhase,
    adpsgd,
    adpsgd_peers,
    dpsgd,
    exchange_bytes,
    gossip_elements,
    interrupt_stretch,
    matching,
)
from syncbench.bench.simulate.hierarchical import (
    BlockPhase,
    hierarchical,
    hierarchical_allreduce_phases,
)
from syncbench.bench.simulate.timeline import LocalTimes
from syncbench.bench.simulate.workload import ComputeSplit, Stragglers, Workload

SPLIT = ComputeSplit(forward=(0.5,), backward=(0.75, 1.0), offsets=(500, 0))


def config(*flags: str):
    """``syncbench simulate``'s namespace: its defaults and ``flags``."""
    return build_parser("simulate").parse_args(["simulate", *flags])


def local_times(n: int, compute: float = 1.0, slowdown: list[float] | None = None,
                update: float = 0.0, params: int = 1000, name: str = "test") -> LocalTimes:
    w = Workload(name=name, params=params, batch_size=1, dataset_samples=1000,
                 mean_compute_s=compute, mean_update_s=update, split=SPLIT)
    return LocalTimes(w, n, slowdown or [1.0] * n, Stragglers(), seed=0)


def by_size(phase) -> float:
    """A stand-in clock that tells phases apart: 1 ms + 1 us per byte of a flow."""
    return 1e-3 + 1e-6 * phase.nbytes


@pytest.fixture
def free_polls(monkeypatch):
    from syncbench.bench.simulate import decentralized

    monkeypatch.setattr(decentralized, "TESTALL_SECONDS", 0.0)


# -- D-PSGD -------------------------------------------------------------------------------

def test_gossip_flows_are_the_graphs_edges_and_bytes_the_send_buffer():
    for spec, n in (("ring", 8), ("torus", 16), ("exp", 16), ("onepeer-exp", 8)):
        schedule = build_graph(spec, n)
        for mixing in schedule.cycle:
            adj = Adjacency.of(mixing)
            flows = adj.flows()
            assert sorted(flows) == sorted((j, i) for i in range(n) for j in mixing.sources(i))
            for r in range(n):
                assert adj.destinations(r) == mixing.destinations(r)
                assert sorted(d for s, d in flows if s == r) == mixing.destinations(r)
    # the message is the model and its running statistics (resnet8: BatchNorm's 480)
    w = Workload(name="resnet8", params=75002, batch_size=1, dataset_samples=1, itemsize=8,
                 extra={"dataset": "synthetic"})
    assert gossip_elements(w) == 75002 + 480 and exchange_bytes(w) == 8 * (75002 + 480)
    # a paper profile has no buildable model: its parameters only
    assert gossip_elements(Workload(name="paper", params=7, batch_size=1,
                                    dataset_samples=1)) == 7


def test_low_precision_gossip_sends_the_codes_to_every_neighbour_of_the_cycle(free_polls):
    """``--gossip-codec int8``: the codec's bytes (as ``to_wire`` makes them), to the union
    of the one-peer cycle's neighbours, from step 1 on (step 0 sends nothing)."""
    from syncbench.algorithms.averagers.compressed_gossip import gossip_codec, to_wire
    from syncbench.bench.simulate.decentralized import gossip_plan

    cfg = config("--algorithm", "dpsgd", "--graph", "onepeer-exp", "--gossip-codec", "int8")
    local = local_times(8)
    schedule = build_graph("onepeer-exp", 8)
    adj, nbytes, first = gossip_plan(cfg, local.workload, schedule)
    assert nbytes == len(to_wire(gossip_codec("int8"), np.zeros(1000, dtype=np.float32)))
    assert first == 1 and len(adj) == 1
    assert adj[0].destinations(0) == sorted({k for m in schedule.cycle
                                             for k in m.destinations(0)})
    timeline = dpsgd(cfg, local, 3, lambda p: 1.5)
    rows = timeline.rows.arrays()
    assert rows[3]["t_wait"].tolist() == pytest.approx([0.0, 0.5, 0.5])


def test_dpsgd_hides_an_exchange_shorter_than_compute(free_polls):
    """Posted before the 1 s compute: a 0.4 s exchange costs nothing, a 1.5 s one 0.5 s."""
    for seconds, step in ((0.4, 1.0), (1.5, 1.5)):
        timeline = dpsgd(config("--algorithm", "dpsgd"), local_times(8), 3,
                         lambda p, s=seconds: s)
        assert timeline.wall_s == pytest.approx(3 * step)
        rows = timeline.rows.arrays()
        assert np.allclose(rows[5]["t_wait"], step - 1.0)
    notes = dpsgd(config("--algorithm", "dpsgd", "--graph", "exp"), local_times(16), 1,
                  lambda p: 0.0).notes
    assert notes["neighbour_bytes_per_step"] == [4 * 1000 * 4]  # tau = 4 destinations
    assert notes["spectral_gap"] == pytest.approx(build_graph("exp", 16).spectral_gap())


def test_dpsgd_compute_pays_the_interrupts_of_the_bytes_it_sends(free_polls):
    """--link-cpu: a rank whose flows start while it computes pays its sent bytes' host
    CPU in its compute (a ring of 8: two destinations of 4,000 bytes, 25 us a byte =
    0.2 s); the exchange (1.5 s) still ends the step, the wait shrinks by as much."""
    plain = dpsgd(config("--algorithm", "dpsgd"), local_times(8), 3, lambda p: 1.5)
    paid = dpsgd(config("--algorithm", "dpsgd", "--link-cpu", "25000"), local_times(8), 3,
                 lambda p: 1.5)
    before, after = plain.rows.arrays()[0], paid.rows.arrays()[0]
    np.testing.assert_allclose(after["t_compute"], before["t_compute"] + 0.2)
    np.testing.assert_allclose(after["t_wait"], before["t_wait"] - 0.2)
    assert paid.wall_s == pytest.approx(plain.wall_s)
    assert paid.notes["link_cpu_s_per_byte"] == pytest.approx(25e-6)
    # a longer stretch than the exchange moves the step out
    slow = dpsgd(config("--algorithm", "dpsgd", "--link-cpu", "250000"), local_times(8), 3,
                 lambda p: 1.5)
    assert slow.wall_s == pytest.approx(3 * (1.0 + 2.0))


def test_interrupts_of_flows_that_start_while_a_rank_waits_cost_it_nothing():
    work, busy_until = np.array([0.2, 0.2]), np.array([1.0, 1.0])
    np.testing.assert_allclose(interrupt_stretch(work, np.array([0.5, 1.5]), busy_until),
                               [0.2, 0.0])


def test_a_slow_rank_holds_up_its_neighbours_only_one_hop_per_step(free_polls):
    """Ring of 8, compute 1 s, rank 0 three times slower (a 2 s delay), exchange 0.4 s.

    Step 0: everyone posts at 0, rank 0 ends at 3, the others at 1. Step 1: ranks 1 and
    7 wait for rank 0's post at 3 (done at 3.4); rank 2's neighbours posted at 1, so it
    ends at 2 + 0 = 2. Step 2: rank 2 waits for rank 1's post at 3.4 (3.8); rank 4 is
    still on its own pace (3)."""
    timeline = dpsgd(config("--algorithm", "dpsgd"),
                     local_times(8, slowdown=[3.0] + [1.0] * 7), 3, lambda p: 0.4)
    rows = timeline.rows.arrays()
    end = {k: rows[k]["t_start"] + rows[k]["t_compute"] + rows[k]["t_delay"]
           + rows[k]["t_wait"] for k in rows}
    assert end[0].tolist() == pytest.approx([3.0, 6.0, 9.0])
    assert end[1].tolist() == pytest.approx([1.0, 3.4, 6.4])
    assert end[2].tolist() == pytest.approx([1.0, 2.0, 3.8])
    assert end[4].tolist() == pytest.approx([1.0, 2.0, 3.0])
    # SSGD's allreduce makes every rank wait for rank 0 at every step
    ssgd = strategies.ssgd(config("--comm", "blocking"),
                           local_times(8, slowdown=[3.0] + [1.0] * 7), 3, lambda p: 0.4)
    assert ssgd.wall_s > 9.0


def test_dpsgd_charges_the_mix_and_the_posts_copy_from_the_workloads_update(free_polls):
    """Update U = 0.07 s, compute 1 s, a free exchange. ``GossipAverager.post`` copies the
    model into the send buffer (2/7 U in ``comm``, before the post); ``average`` mixes k
    sources' rows and its own, then copies the result into the parameters: the update
    phase is SSGD's U plus (k + 1 + 2/7) U, k = 2 on a ring, 4 on the exponential graph
    of 16, 1 on each matrix of the one-peer cycle."""
    u = 0.07
    assert COPY_SHARE == pytest.approx(2 / 7)
    ssgd = strategies.ssgd(config("--comm", "blocking"), local_times(8, update=u), 3,
                           lambda p: 0.0).rows.arrays()
    assert ssgd[0]["t_update"].tolist() == pytest.approx([u] * 3)
    for graph, n, k in (("ring", 8, 2), ("exp", 16, 4), ("onepeer-exp", 8, 1)):
        timeline = dpsgd(config("--algorithm", "dpsgd", "--graph", graph),
                         local_times(n, update=u), 3, lambda p: 0.0)
        rows = timeline.rows.arrays()
        mix = (k + 1 + 2 / 7) * u
        for r in rows.values():
            assert r["t_update"] - u == pytest.approx([mix] * 3)
            assert r["t_comm"].tolist() == pytest.approx([2 / 7 * u] * 3)
        step = 2 / 7 * u + 1.0 + u + mix
        assert rows[1]["t_start"].tolist() == pytest.approx([0.0, step, 2 * step])
        assert timeline.wall_s == pytest.approx(3 * step)
    # the low-precision averager copies no model into its send buffer, but mixes alike
    rows = dpsgd(config("--algorithm", "dpsgd", "--gossip-codec", "int8"),
                 local_times(8, update=u), 2, lambda p: 0.0).rows.arrays()
    assert rows[0]["t_comm"].tolist() == [0.0, 0.0]
    assert rows[0]["t_update"].tolist() == pytest.approx([u + (2 + 1 + 2 / 7) * u] * 2)


def test_dpsgd_times_the_mix_and_the_copy_here_against_a_measured_workloads_optimizer(
        free_polls):
    """A workload measured from a run names its optimizer (``extra["optimizer"]``): the mix
    and the post's copy are then the averager's own operations timed on this host in units
    of that optimizer's step (:func:`.gossip_mix.mix_ratios`), not ``k + 1 + 2/7`` passes,
    which NumPy's one-row product (k = 1) leaves about three times short on an AMD EPYC
    guest. An update scaled to another optimizer is taken back to the measured step."""
    from syncbench.bench.simulate.gossip_mix import mix_ratios

    u, params = 0.07, 20000
    for graph, n, k in (("ring", 8, 2), ("onepeer-exp", 8, 1)):
        lt = local_times(n, update=u, params=params)
        lt.workload.extra.update(optimizer="sgd")
        timeline = dpsgd(config("--algorithm", "dpsgd", "--graph", graph), lt, 2,
                         lambda p: 0.0)
        mix, copy = mix_ratios(k, params, "sgd")
        assert mix > 0 and copy > 0
        for r in timeline.rows.arrays().values():
            assert r["t_update"] - u == pytest.approx([mix * u] * 2)
            assert r["t_comm"] == pytest.approx([copy * u] * 2)
        assert timeline.notes["mix_update_passes"][0] == pytest.approx(mix)
    lt = local_times(2, update=u, params=params)
    lt.workload.extra.update(optimizer="sgd", update_factor=4.0)
    rows = dpsgd(config("--algorithm", "dpsgd"), lt, 1, lambda p: 0.0).rows.arrays()
    assert rows[0]["t_update"] - u == pytest.approx([mix_ratios(1, params, "sgd")[0] * u / 4])


def test_a_quota_slows_dpsgds_copy_mix_and_its_sent_bytes_kernel_work(free_polls):
    """At speed 0.5 (a CPU quota) the copy into the send buffer, the mix and the kernel's
    work on the sent bytes (``--link-cpu``) are CPU work of the rank's own, and take twice
    as long; the free rank's do not. Measured before (mlp, a ring of 2 emulated nodes at
    1 Gbit/s, the second node at speed 0.5, AMD EPYC guest): the throttled rank's
    ``update`` 2.37-2.71 ms a step against the free rank's 1.31-1.37, and the run predicted
    24-36% fast (docs/RESULTS.md, "Hook calls timed, D-PSGD at a quota and the links'
    bucket")."""
    u = 0.07
    w = Workload(name="test", params=1000, batch_size=1, dataset_samples=1000,
                 mean_compute_s=1.0, mean_update_s=u, split=SPLIT)
    lt = LocalTimes(w, 2, [1.0, 2.0], Stragglers(), seed=0, speeds=[1.0, 0.5])
    cfg = config("--algorithm", "dpsgd", "--link-cpu", "1000")  # 1 us a byte: 4 ms a step
    rows = dpsgd(cfg, lt, 2, lambda p: 0.0).rows.arrays()
    mix = (1 + 1 + 2 / 7) * u
    assert rows[0]["t_update"] - u == pytest.approx([mix] * 2)
    assert rows[1]["t_update"] - u == pytest.approx([2 * mix] * 2)
    assert rows[1]["t_comm"] == pytest.approx(2 * rows[0]["t_comm"])
    # the throttled rank's compute row is the workload's (its quota is in its delay); the
    # flows start while it computes at every step, while the free rank computes at the first
    sent = exchange_bytes(w) * 1e-6
    assert rows[0]["t_compute"][0] - 1.0 == pytest.approx(sent)
    assert rows[1]["t_compute"] - 1.0 == pytest.approx([2 * sent] * 2)


def test_a_dpsgd_exchange_after_an_idle_spell_passes_its_buckets_bytes_at_once(free_polls):
    """The links' token bucket (``--link-burst``) refills while a rank's link is idle, at
    the link's rate, and passes its bytes at once: the first exchange loses the bucket's
    share of its time on the wire; the next, posted before compute, gains what refilled
    during the last step's mix and update and its own copy. Measured before (mlp, a ring
    of 2 emulated nodes at 1 Gbit/s, a 256 KB bucket): 6.5 ms from the post to the wait's
    end against the wire's 7.9, and D-PSGD predicted 9-11% slow (docs/RESULTS.md, "Hook
    calls timed, D-PSGD at a quota and the links' bucket")."""
    from syncbench.bench.simulate.decentralized import bucket_saving

    w = local_times(2, compute=1e-3, params=2500, update=1e-3).workload  # 10,000 B a message
    wire, latency = 0.010, 1e-3  # 1 MB/s on the wire

    def clock(phase):
        return latency + wire * phase.nbytes / 10000

    burst = 4000.0
    placed = PlacedClock(clock, burst=burst)
    rows = dpsgd(config("--algorithm", "dpsgd"), LocalTimes(w, 2, [1.0, 1.0], Stragglers(),
                                                            seed=0), 3, placed).rows.arrays()
    waits = rows[0]["t_wait"]
    on_wire = wire * 9999 / 10000  # beyond a 1-byte exchange
    # the first exchange finds the bucket full: 4,000 of 10,000 B at once
    assert waits[0] == pytest.approx(latency + wire - 0.4 * on_wire - 1e-3)
    # the next: the link idle through the mix, the update and the copy (3.6 ms: 3,571 B)
    idle = rows[0]["t_update"][0] + rows[0]["t_comm"][1]
    credit = idle * 10000 / on_wire
    assert 3000 < credit < burst
    assert waits[1] == pytest.approx(latency + wire - on_wire * credit / 10000 - 1e-3)
    plain = dpsgd(config("--algorithm", "dpsgd"), LocalTimes(w, 2, [1.0, 1.0], Stragglers(),
                                                             seed=0), 3, clock).rows.arrays()
    assert plain[0]["t_wait"] == pytest.approx([latency + wire - 1e-3] * 3)
    saved = bucket_saving(burst, np.array([10000.0, 0.0]), wire, np.array([np.inf, 1.0]))
    assert saved.tolist() == pytest.approx([wire * 0.4, 0.0])


def test_dpsgd_is_registered_and_bad_graphs_are_one_line():
    assert strategies.pattern_of("dpsgd") == "dpsgd"
    assert strategies.simulator_for("dpsgd") is dpsgd
    with pytest.raises(ValueError, match="torus does not fit 7 ranks") as err:
        dpsgd(config("--algorithm", "dpsgd", "--graph", "torus"), local_times(7), 1,
              lambda p: 0.0)
    assert "\n" not in str(err.value)


# -- AD-PSGD ------------------------------------------------------------------------------

def path_graph(tmp_path, n: int) -> str:
    path = tmp_path / "path.txt"
    path.write_text("".join(f"{i} {i + 1}\n" for i in range(n - 1)))
    return str(path)


def test_adpsgd_exclusive_locks_serialise_averages_on_one_target(tmp_path):
    """Path 0 - 1 - 2: both active ranks (0, 2) average with passive rank 1 after a 1 s
    compute. One-way latency L = 0.1 and the model's transfer T = 0.1 (the clock's), no
    epoch overhead: the requests reach rank 1 at 1.1; rank 0's holds the window to
    1.1 + 2L + 2T = 1.5 and ends at 1.6 (the unlock's acknowledgement); rank 2's is
    granted at 1.5 (a 0.4 s wait), holds it to 1.9, ends at 2.0. Rank 1 read its model
    at 1.0 (before them) and updates at 2.0, the window free again."""
    cfg = config("--rma-epoch-us", "0")
    cfg.graph = path_graph(tmp_path, 3)
    timeline = adpsgd(cfg, local_times(3), 1, lambda p: 0.1)
    rows = timeline.rows.arrays()
    assert rows[0]["t_wait"].tolist() == [0.0]
    assert rows[0]["t_comm"].tolist() == pytest.approx([0.6])
    assert rows[2]["t_wait"].tolist() == pytest.approx([0.4])
    assert rows[2]["t_comm"].tolist() == pytest.approx([0.6])
    assert rows[1]["t_wait"].tolist() == [0.0] and rows[1]["t_comm"].tolist() == [0.0]
    assert timeline.wall_s == pytest.approx(2.0)
    assert timeline.notes["averages"] == 2


def test_adpsgd_passive_update_waits_for_an_average_in_progress(tmp_path):
    """Passive compute of 1 s, active 0.5 s: rank 0's average of rank 1's window is
    granted at 0.6 and holds it to 1.0 + 0.2 (L = 0.1, T = 0.2: 0.6 + 0.2 + 0.4); rank 1's
    update at 1.0 waits 0.2 s for it."""
    cfg = config("--rma-epoch-us", "0")
    cfg.graph = path_graph(tmp_path, 2)
    local = local_times(2)
    local.ensure(1)
    local.cols[0, :, 1] = 0.5  # rank 0 (active) computes 0.5 s

    def clock(phase) -> float:
        return 0.1 if phase.nbytes <= 8 else 0.2

    rows = adpsgd(cfg, local, 1, clock).rows.arrays()
    assert rows[1]["t_wait"].tolist() == pytest.approx([0.2])
    assert rows[0]["t_comm"].tolist() == pytest.approx([0.1 + 0.6 + 0.1])


def test_adpsgd_ranks_meet_every_meet_every_steps(tmp_path):
    """Path 0 - 1, active rank 0 computes 1 s, passive rank 1 3 s (a 2 s delay), free
    averages; the stop vote (``stop_vote_lag`` 2) takes v. With ``--meet-every 1`` rank 0
    posts vote q after its step q and completes vote q - 2, which rank 1 posted at 3(q - 2):
    its steps start at 0, 1, 2, then 3 + v, 6 + v, 9 + v. With the default 10, six steps
    reach one meeting, at the end: rank 0 runs at its own pace."""
    def clock(phase) -> float:
        return 0.0 if isinstance(phase, PairsPhase) else 0.25

    def run(*flags: str):
        cfg = config("--rma-epoch-us", "0", *flags)
        cfg.graph = path_graph(tmp_path, 2)
        return adpsgd(cfg, local_times(2, slowdown=[1.0, 3.0]), 6, clock)

    timeline = run("--meet-every", "1")
    v = timeline.notes["vote_s"]
    assert v > 0 and timeline.notes["meetings"] == 6 and timeline.notes["meet_every"] == 1
    rows = timeline.rows.arrays()
    assert rows[0]["t_start"].tolist() == pytest.approx([0, 1, 2, 3 + v, 6 + v, 9 + v])
    assert rows[1]["t_start"].tolist() == pytest.approx([0, 3, 6, 9, 12, 15])
    # rank 0 waits v, then 2 s at votes 4, 5 and its last (6, for rank 1's vote 4 at 12)
    assert timeline.notes["meeting_wait_s"] == pytest.approx(v + 3 * 2.0)
    # the wait is off the clock: no phase holds it
    assert rows[0]["t_wait"].tolist() == [0.0] * 6
    default = run()
    assert default.notes["meet_every"] == 10 and default.notes["meetings"] == 1
    assert default.rows.arrays()[0]["t_start"].tolist() == pytest.approx([0, 1, 2, 3, 4, 5])


def test_adpsgd_steps_and_peers_follow_the_code(tmp_path):
    schedule = build_graph("ring", 8)
    _, peers = adpsgd_peers(schedule.cycle[0], 8)
    assert peers[0] == [1, 7] and peers[3] == [2, 4]
    assert matching(peers) == ((1, 0), (3, 2), (5, 4), (7, 6))
    _, exp_peers = adpsgd_peers(build_graph("exp", 8).cycle[0], 8)
    targets = [j for j, _ in matching(exp_peers)]
    assert len(targets) == len(set(targets)) == 4  # one average per window at a time
    timeline = adpsgd(config(), local_times(8), 5, lambda p: 1e-3)
    rows = timeline.rows.arrays()
    assert all(rows[k]["step"].tolist() == list(range(5)) for k in range(8))
    assert timeline.notes["averages"] == 4 * 5
    assert strategies.SIMULATORS["adpsgd"] is adpsgd
    cfg = config()
    cfg.graph = str(tmp_path / "none.txt")
    (tmp_path / "none.txt").write_text("0 2\n1 3\n2 3\n")  # rank 0's only neighbour is even
    with pytest.raises(ValueError, match="rank 0 has no neighbour of the other parity"):
        adpsgd(cfg, local_times(4), 1, lambda p: 0.0)


# -- hierarchical ---------------------------------------------------------------------------

def test_hierarchical_allreduce_at_one_rank_per_node_is_the_flat_one():
    for n in (2, 6, 64):
        flat = allreduce_phases(4e6, n, "auto")
        assert hierarchical_allreduce_phases(4e6, n, 1, "auto") == flat
    phases = hierarchical_allreduce_phases(4e6, 16, 4, "auto")
    node = [p for p in phases if isinstance(p, BlockPhase)]
    assert node and all(max(max(s, d) % 4 for s, d in p.pairs()) <= 3 for p in node)
    assert all(s // 4 == d // 4 for p in node for s, d in p.pairs())  # inside a node
    leaders = [p for p in phases if not isinstance(p, BlockPhase) and p.stride == 4]
    assert leaders and all(s % 4 == 0 and d % 4 == 0 for p in leaders for s, d in p.pairs())


def test_ssgd_hierarchical_comm_equals_blocking_at_one_rank_per_node():
    simulate = strategies.simulator_for("ssgd")
    flat = simulate(config("--comm", "blocking"), local_times(16, params=250_000), 3,
                    PlacedClock(by_size, 1))
    hier = simulate(config("--comm", "hierarchical"), local_times(16, params=250_000), 3,
                    PlacedClock(by_size, 1))
    assert hier.wall_s == pytest.approx(flat.wall_s) and hier.wall_s > 3.0
    # 4 per node: the node's Allreduce, the leaders', the node's Bcast, once per step
    hier = simulate(config("--comm", "hierarchical"), local_times(16, params=250_000), 3,
                    PlacedClock(by_size, 4))
    phases = hierarchical_allreduce_phases(1e6, 16, 4, "auto")
    per_step = sum(by_size(p) * p.repeat for p in phases)
    assert hier.wall_s == pytest.approx(3 * (1.0 + per_step))


def test_hierarchical_at_one_rank_per_node_is_local_sgd_with_the_global_period():
    args = ("--node-period", "2", "--global-period", "4")
    clock = PlacedClock(by_size, 1)
    hier = hierarchical(config("--algorithm", "hierarchical", *args), local_times(8), 10, clock)
    flat = strategies.localsgd(config("--algorithm", "localsgd", "--period", "4"),
                               local_times(8), 10, clock)
    assert hier.wall_s == pytest.approx(flat.wall_s)
    h, f = hier.rows.arrays(), flat.rows.arrays()
    for k in range(8):
        assert np.allclose(h[k]["t_comm"], f[k]["t_comm"])
    # with H1 = H2 it is Local SGD at any ranks per node
    same = ("--node-period", "4", "--global-period", "4")
    clock4 = PlacedClock(by_size, 4)
    hier = hierarchical(config("--algorithm", "hierarchical", *same), local_times(8), 10,
                        clock4)
    flat = strategies.localsgd(config("--algorithm", "localsgd", "--period", "4"),
                               local_times(8), 10, clock4)
    assert hier.wall_s == pytest.approx(flat.wall_s)


def test_a_node_average_waits_for_its_nodes_last_rank_only():
    """8 ranks, 4 per node, rank 0 twice as slow: its node's average (every 1 step) waits
    for it, the other node's does not; the global average (step 4) waits for everyone."""
    cfg = config("--algorithm", "hierarchical", "--node-period", "1", "--global-period", "4")
    timeline = hierarchical(cfg, local_times(8, slowdown=[2.0] + [1.0] * 7), 4,
                            PlacedClock(lambda p: 0.0, 4))
    rows = timeline.rows.arrays()
    assert rows[1]["t_comm"][:3].tolist() == pytest.approx([1.0, 1.0, 1.0])
    assert rows[5]["t_comm"][:3].tolist() == pytest.approx([0.0, 0.0, 0.0])
    assert rows[5]["t_comm"][3] == pytest.approx(4.0)  # 8 - 4: rank 0's 4 steps of 2 s
    assert timeline.wall_s == pytest.approx(8.0)


@pytest.mark.parametrize("flags,n,message", [
    (("--gpus-per-node", "4"), 4, "2 or more nodes of --gpus-per-node 4 ranks"),
    (("--group-size", "3"), 8, "2 or more groups of --group-size 3 ranks"),
])
def test_hierarchical_bad_groups_are_one_line(flags, n, message):
    cfg = config("--algorithm", "hierarchical", *flags)
    rpn = int(getattr(cfg, "gpus_per_node", 1))
    with pytest.raises(ValueError, match=message) as err:
        hierarchical(cfg, local_times(n), 1, PlacedClock(lambda p: 0.0, rpn))
    assert "\n" not in str(err.value)


def test_adpsgd_over_tcp_waits_for_the_passive_peers_polls(tmp_path):
    """The path of the test above with --rma-progress polls: the passive rank polls at
    its hooks (0.5, 0.75 and 1.0 of its 1 s compute: gaps 0.5, 0.25, 0.25), so each of an
    average's three requests (the lock's grant, the Get, the Put and unlock) waits
    sum(g^2) / (2 sum(g)) = 0.1875 s on average for it; rank 0's average takes
    0.6 + 3 x 0.1875 s."""
    cfg = config("--rma-epoch-us", "0", "--rma-progress", "polls")
    cfg.graph = path_graph(tmp_path, 3)
    timeline = adpsgd(cfg, local_times(3), 1, lambda p: 0.1)
    assert timeline.notes["peer_poll_wait_s"] == pytest.approx(0.1875, rel=1e-2)
    assert timeline.rows.arrays()[0]["t_comm"].tolist() == pytest.approx([1.1625], rel=1e-2)
    immediate = config("--rma-epoch-us", "0", "--rma-progress", "immediate")
    immediate.graph = cfg.graph
    rows = adpsgd(immediate, local_times(3), 1, lambda p: 0.1).rows.arrays()
    assert rows[0]["t_comm"].tolist() == pytest.approx([0.6])


def test_adpsgd_passive_peer_polls_through_an_emulated_slowdown_and_between_a_quotas_freezes(
        tmp_path):
    """A passive rank slowed 2x (--slowdown, as --slowdown-mode work runs it: the model's
    passes with their hooks) polls in its delay as in its compute: gaps 0.5, 0.25, 0.25
    twice, the same mean wait 0.1875 s. The same 2x made by a node quota (the rank at
    speed 0.5) freezes it a millisecond at a time between its hooks, which spread over the
    2 s compute: gaps 1.0, 0.5, 0.5, a wait of (1 + 2 x 0.5^2) / (2 x 2) = 0.375 s. Before,
    the quota was one frozen gap of 1 s after the compute's (0.5, 0.25, 0.25): 0.34375 s,
    and on lenet, whose hooks are many, the frozen block made the peer's mean wait per
    request 2.6-3.1 ms against 1.6-1.9 with the freezes between the hooks (AD-PSGD at a
    quota at 200 Mbit/s: the active rank's average 26.4-28.0 ms a step predicted, now
    23.3-24.3, 20.4-22.0 measured; docs/RESULTS.md, "A passive peer's polls at a
    quota"). Before the delay's polls were
    in the model, the slowdown gave 0.34375 too (resnet8 at 200 Mbit/s, work mode: sync
    predicted 31-32 ms a step, 14.5-15.3 measured)."""
    cfg = config("--rma-epoch-us", "0", "--rma-progress", "polls")
    cfg.graph = path_graph(tmp_path, 3)
    slowed = adpsgd(cfg, local_times(3, slowdown=[1.0, 2.0, 1.0]), 1, lambda p: 0.1)
    assert slowed.notes["peer_poll_wait_s"] == pytest.approx(0.1875, rel=1e-2)
    w = local_times(3).workload
    quota = LocalTimes(w, 3, [1.0, 2.0, 1.0], Stragglers(), seed=0, speeds=[1.0, 0.5, 1.0])
    frozen = adpsgd(cfg, quota, 1, lambda p: 0.1)
    assert frozen.notes["peer_poll_wait_s"] == pytest.approx(0.375, rel=1e-2)
    assert quota.polled_delay([1], 1) == 0.0


def test_adpsgd_put_finds_the_links_token_bucket_full(tmp_path):
    """With a token bucket on the links (--link-burst), an average's Put (the active rank
    drives it from inside MPI, its link idle for a step) sends its first ``burst`` bytes at
    the wire's speed; the Get's reply, which leaves the passive target as it progresses,
    does not. The model's 4,000 bytes take 1 ms + 4 ms on the stand-in clock; a 2,000-byte
    bucket takes half of the Put's 4 ms wire time (less the 8-byte latency probe's 8 us)
    off the average."""
    cfg = config("--rma-epoch-us", "0", "--rma-progress", "immediate")
    cfg.graph = path_graph(tmp_path, 3)
    plain = adpsgd(cfg, local_times(3), 1, PlacedClock(by_size, 1)).rows.arrays()
    bucket = adpsgd(cfg, local_times(3), 1, PlacedClock(by_size, 1, 2000.0)).rows.arrays()
    saved = 0.5 * ((1e-3 + 4e-3) - (1e-3 + 8e-6))
    assert bucket[0]["t_comm"][0] == pytest.approx(plain[0]["t_comm"][0] - saved, rel=1e-6)
