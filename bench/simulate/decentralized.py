"""The decentralized strategies' simulated traffic: D-PSGD's gossip and AD-PSGD's averages.

**D-PSGD** (Lian et al., NeurIPS 2017, arXiv 1705.09056, Alg. 1; ``algorithms/dpsgd.py``
with ``algorithms/averagers/gossip.py``): each step every rank posts one
``Ineighbor_allgather`` of its model (parameters, then BatchNorm's running statistics,
:func:`gossip_elements`) to the graph's destinations before compute
(``GossipAverager.post``), polls it at every hook call of the compute (``poll``), spends
the straggler's delay and completes it (``average``'s ``Wait``), then mixes and steps.
The graph is ``algorithms/graphs.py``'s own (:func:`~syncbench.algorithms.graphs.build_graph`,
its cycle for ``onepeer-exp``). MPICH runs a nonblocking neighbourhood allgather as one
schedule stage (every ``Isend`` and ``Irecv`` posted at once,
``MPIR_Ineighbor_allgather_allcomm_sched_linear``), so, as :mod:`.progress` issues a
collective's first stage when its ranks have posted it, a flow between two neighbours
starts when both have posted and needs no later poll. Every flow of a step is one SimGrid
phase (:class:`GraphPhase`: all of them at once, the slowest one's time); a rank's
exchange ends that long after the later of its own post and its neighbours' latest post.
There is no global collective: a slow rank holds up its neighbours only, and its
neighbours' neighbours one step later. With ``--gossip-codec``
(``CompressedGossipAverager``) the message is the codec's code of the step's change (its
``wire_bytes``), sent from the second step on to the destinations of every matrix of the
cycle (one graph communicator), as that averager sends it.

D-PSGD's local work beyond SSGD's, in units of the workload's measured update U (the
1-rank run's optimizer step over the parameters, replayed per rank and step, so it follows
the machine and the model): the mix ``x_i <- W_ii x_i + sum_j W_ij x_j`` in ``update``
(``GossipAverager.average``: the own term and each of the k sources' rows is one
multiply-add over the whole model, NumPy writing a temporary the model's size for each
operation, then the mixed vector is copied into the parameters), ``(k + 1) U`` plus a
copy (:func:`mix_units`); and the post's copy of the model into the send buffer in
``comm`` before the exchange starts. A copy (a read and a write per element) is 2/7 U
(:data:`COPY_SHARE`: SSGD's update is the mean's scale, a read and a write, and the fused
momentum step's three reads and two writes). The codec's averager mixes its replicas of
the k sources alike (``mix``, after copying the parameters); its encode and decode are
left out. Evidence (mlp, 235,146 parameters, a ring of 2 ranks on 2 emulated nodes at
1 Gbit/s, k = 1; the validation runs of docs/RESULTS.md): the ``update`` phase averaged
1.6-2.2 ms a step per rank in the two runs on a quiet host, against 0.43 ms for the 1-rank
workload and 0.55-0.81 ms for SSGD on the same two nodes; the model gives
0.43 (1 + 2 + 2/7) = 1.41 ms, the rest is the slowdown of memory-bound work with both
nodes' ranks on the host, which SSGD's update shows as well (1.3-1.9x). In isolation on
that host (2 shared cores), the mix of 235,146 float32 took 0.8-1.8 ms for k = 1 (NumPy's
one-row ``weights @ recv`` alone 0.5-0.9 ms), 0.55-0.87 ms for k = 2 and 0.69 ms for
k = 4, against 0.15-0.24 ms for SSGD's update: k + 1 passes is the middle of that, low for
one source and high for four: a workload measured from a run (which names its
optimizer) has both timed on this host instead, in units of that optimizer's step
(:func:`mix_units`, :mod:`.gossip_mix`), the round figure stays for profiles. A node's CPU
quota slows the copy, the mix and the kernel's work on the sent bytes by ``1 / speed``,
as it slows compute (:meth:`.timeline.LocalTimes.quota_stretch`). An exchange posted
after the rank's link was idle finds the links' token bucket refilled at the link's rate
for that while (the last step's mix and update, this step's data and copy), and its
first bytes pass at once (:func:`bucket_saving`). The kernel's packet processing of the
bytes a rank sends (``--link-cpu``, which ``syncbench comm`` measures and ``--calibrate``
hands on: 10.9-13.2 ns a byte on emulated 200 Mbit/s links whose 51 KB ``tbf`` bucket was smaller
than a 64 KB TCP segment, about 1 ns since the cluster caps the segments) is paid by its
compute when its flows start while it computes (:func:`interrupt_stretch`). Left out:
the consensus ``Allreduce`` of an evaluation (the simulator models no evaluation) and the
moving of the model through TCP inside the ``Testall`` polls (measured ``comm`` 1.1-1.9
ms a step against the copy's 0.12 ms, 0.24-0.37 ms with capped segments).

**AD-PSGD** (Lian et al., ICML 2018, arXiv 1710.06952, Alg. 1;
``algorithms/averagers/pairwise.py``): even (active) ranks compute a gradient, then
average with a random passive neighbour of the other parity
(:func:`~syncbench.algorithms.averagers.pairwise.bipartite_peers`, the code's rule):
``Lock(EXCLUSIVE)`` on the peer's window, ``Get`` + ``Flush``, the mean, ``Put``,
``Unlock``, then apply the gradient; odd (passive) ranks compute and apply their
gradients only, inside an EXCLUSIVE epoch on their own window
(``PairwiseWindow.update_own``), which an average holding that window excludes. Simulated
event by event in time order (as :mod:`.asgd` serves its counter): each passive window is
one FIFO lock served in arrival order, so averages on one target and the target's own
updates are serialised. Costs: the lock's and the unlock's round trips and the
per-epoch overhead (``--rma-epoch-us``, :class:`.asgd.RmaCosts`), the model's bytes each
way on SimGrid (active ranks transferring at once to distinct targets, :func:`matching`),
the ``Put`` less what the links' token bucket (``--link-burst``) passes at once: it leaves
the active rank, which drives it from inside MPI, on a link idle since the node's last
average, a step earlier, long enough to refill the bucket (2.1 ms on the emulated
cluster). The ``Get``'s reply leaves the passive target as that rank progresses (its
polls) and takes the wire's time. Measured on 2 emulated nodes (docs/RESULTS.md, "A
quota's first burst, AD-PSGD's bucket and the polls of a slowdown"): lenet's 247 KB
average took 18.0 ms a step at 200 Mbit/s (a 51 KB bucket), 22 predicted without the
bucket; with the bucket on both transfers, the 1 Gbit/s runs (a 256 KB bucket, larger
than the model) were predicted 24-39% fast, with it on the Put alone -7..+9%.
A passive peer at a node quota polls between the quota's freezes, its hooks spread over
its stretched compute (:func:`.asgd.poll_gaps`' ``stretch``): with one frozen gap after
its compute instead, AD-PSGD on lenet at 200 Mbit/s at a quota was predicted 15-18% slow
(the peer's mean wait per request 2.6-3.1 ms against 1.6-1.9 now; docs/RESULTS.md, "A
passive peer's polls at a quota").
Assumption (as ASGD's owners): a target grants a lock as the request arrives when its
window is free (native RMA or a progress engine that keeps up), which is optimistic.
Every rank takes ``--steps`` steps of its own (no budget shared between ranks), and the
ranks meet as ``algorithms/adpsgd.py``'s do: at every ``--meet-every`` steps of its own
(its evaluation points) the driver's stop vote posts an 8-byte ``Iallreduce`` and
completes the one posted ``stop_vote_lag`` (2) points before, so a rank ahead waits there,
off the training clock, until the slowest rank has posted that vote (:class:`Meetings`;
the vote's delivery is an 8-byte nonblocking allreduce on the platform).
"""

from __future__ import annotations

import argparse
import heapq
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from syncbench.algorithms.averagers.compressed_gossip import gossip_codec
from syncbench.algorithms.averagers.pairwise import bipartite_peers, check_bipartite
from syncbench.algorithms.graphs import GraphSchedule, Mixing, build_graph
from syncbench.algorithms.registry import get_algorithm
from syncbench.bench.simulate.asgd import (
    COUNTER_BYTES,
    costs_from,
    poll_gaps,
    rma_progress,
    target_wait,
)
from syncbench.bench.simulate.collectives import PhaseClock, burst_of, cost, placed_phases
from syncbench.bench.simulate.gossip_mix import mix_ratios
from syncbench.bench.simulate.inputs import link_cpu
from syncbench.bench.simulate.progress import TESTALL_SECONDS, compute_polls
from syncbench.bench.simulate.timeline import LocalTimes, StepRows, Timeline
from syncbench.bench.simulate.workload import Workload, build_zoo_model

#: A copy of the model (one read and one write per element) in units of the workload's
#: update, SSGD's: the mean's scale (a read and a write per element) and the fused
#: momentum step (three reads and two writes), 7 element passes in all.
COPY_SHARE = 2.0 / 7.0
#: The mix's passes over the model besides its k sources' rows, in units of the workload's
#: update: the own term ``W_ii x_i`` (the module docstring).
MIX_PASSES_OVER_K = 1.0
#: Bytes of a stop vote (``StopVote``: one int64).
VOTE_BYTES = 8


def gossip_elements(workload: Workload) -> int:
    """Elements of one gossip message: the parameters and the running statistics.

    ``GossipAverager.send`` is ``model.params.size + model.buffers.size`` wide. The
    buffers are the model's own where the zoo builds it (a run file's model, the
    ``mlp`` and ``lenet`` profiles), else none (a paper profile carries parameters only).
    """
    dataset = str(workload.extra.get("dataset", "fashion-mnist"))
    try:
        buffers = int(build_zoo_model(workload.name, dataset).buffers.size)
    except (ValueError, KeyError):
        buffers = 0
    return int(workload.params) + buffers


@dataclass(frozen=True)
class Adjacency:
    """Each rank's sources and destinations of one mixing matrix, built in O(edges).

    ``Mixing.destinations`` scans every row (O(N) per rank, O(N^2) for all: minutes at
    16,384 ranks); this holds the same lists, so the code's functions that take a
    ``Mixing`` for its ``sources``/``destinations``/``size`` (``bipartite_peers``,
    ``check_bipartite``) run on it unchanged.
    """

    size: int
    src: tuple[tuple[int, ...], ...]
    dst: tuple[tuple[int, ...], ...]

    @classmethod
    def of(cls, *cycle: Mixing) -> Adjacency:
        """The edges of one matrix, or of the union of a cycle's (the low-precision
        averager's one graph communicator)."""
        n = cycle[0].size
        src: list[set[int]] = [set() for _ in range(n)]
        for mixing in cycle:
            for i, row in enumerate(mixing.rows):
                src[i].update(row)
        dst: list[list[int]] = [[] for _ in range(n)]
        for i, row in enumerate(src):
            for j in row:
                dst[j].append(i)
        return cls(n, tuple(tuple(sorted(r)) for r in src), tuple(tuple(sorted(d)) for d in dst))

    def sources(self, rank: int) -> list[int]:
        return list(self.src[rank])

    def destinations(self, rank: int) -> list[int]:
        return list(self.dst[rank])

    def flows(self) -> list[tuple[int, int]]:
        """(sender, receiver) of every message of one exchange: j -> i for W_ij > 0."""
        return [(j, i) for i, row in enumerate(self.src) for j in row]

    def peers(self) -> np.ndarray:
        """``(N, D)`` each rank's neighbours either way, padded with the rank itself."""
        both = [sorted(set(s) | set(d)) for s, d in zip(self.src, self.dst)]
        width = max((len(b) for b in both), default=0)
        out = np.repeat(np.arange(self.size)[:, None], max(width, 1), axis=1)
        for i, b in enumerate(both):
            out[i, :len(b)] = b
        return out


@dataclass(frozen=True)
class GraphPhase:
    """Every message of one gossip exchange at once (a phase for :class:`.engine.Network`).

    ``graph`` and ``index`` (the matrix of the cycle) name the phase in the cache;
    ``flows`` are the adjacency's (sender, receiver) pairs, ``nbytes`` each.
    """

    graph: str
    index: int
    n: int
    nbytes: float
    flows: tuple[tuple[int, int], ...] = field(repr=False, compare=False, default=())
    repeat: int = 1

    def key(self) -> tuple:
        return ("graph", self.graph, self.index, self.n)

    def pairs(self) -> list[tuple[int, int]]:
        return list(self.flows)


def graph_of(cfg: argparse.Namespace, n: int) -> GraphSchedule:
    """``--graph`` (default ring) over ``n`` ranks, validated by the code's ``build_graph``."""
    return build_graph(str(getattr(cfg, "graph", "ring") or "ring"), n)


def exchange_bytes(workload: Workload) -> float:
    """Bytes of one rank's model to one destination (``GossipAverager.send.nbytes``)."""
    return float(gossip_elements(workload) * workload.itemsize)


def gossip_plan(cfg: argparse.Namespace, w: Workload,
                schedule: GraphSchedule) -> tuple[list[Adjacency], float, int]:
    """(the adjacency of each step of the cycle, bytes per message, first step that
    sends). Exact models (``GossipAverager``): each matrix's own neighbours, the model's
    bytes, from step 0. ``--gossip-codec`` (``CompressedGossipAverager``): one graph
    communicator over every matrix's neighbours, the codec's ``wire_bytes`` of the
    float32 change, from step 1 (step 0 has no change to send)."""
    codec = gossip_codec(str(getattr(cfg, "gossip_codec", "none") or "none"))
    if codec is None:
        return [Adjacency.of(m) for m in schedule.cycle], exchange_bytes(w), 0
    return [Adjacency.of(*schedule.cycle)], float(codec.wire_bytes(int(w.params))), 1


def mix_sources(schedule: GraphSchedule) -> list[np.ndarray]:
    """Per matrix of the cycle, each rank's count of sources k (the rows it mixes in:
    ``GossipAverager.average``'s ``weights``, ``CompressedGossipAverager``'s replicas of the
    step's sources)."""
    return [np.array([len(s) for s in Adjacency.of(m).src], dtype=float)
            for m in schedule.cycle]


def mix_units(workload: Workload, sources: list[np.ndarray],
              count: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per matrix of the cycle (``sources``: each rank's count of sources k), each rank's
    mix ``x_i <- W_ii x_i + sum_j W_ij x_j`` and the post's copy of the model, in units of
    its step's local ``update`` (the workload's measured optimizer step), over ``count``
    exchanged elements.

    A float32 workload measured from a run names the optimizer its ``update`` rows
    stepped (``extra["optimizer"]``): both are then timed on this host against that step
    (:func:`.gossip_mix.mix_ratios`, each distinct k once; an update another local
    optimizer's ratio scaled, ``extra["update_factor"]``, is taken back to the measured
    step first). Otherwise (a profile) the round figure: ``k + 1`` passes and a copy for
    the mix (:data:`MIX_PASSES_OVER_K`, :data:`COPY_SHARE`), the copy alone for the post
    (the evidence: the module docstring)."""
    optimizer = workload.extra.get("optimizer")
    if not optimizer or count <= 0 or workload.itemsize != 4:
        return [(k + MIX_PASSES_OVER_K + COPY_SHARE, np.full(len(k), COPY_SHARE))
                for k in sources]
    per_update = 1.0 / float(workload.extra.get("update_factor", 1.0) or 1.0)
    units = []
    for k in sources:
        ks, inverse = np.unique(np.asarray(k, dtype=int), return_inverse=True)
        pairs = per_update * np.array([mix_ratios(int(x), count, str(optimizer)) for x in ks])
        units.append((pairs[inverse, 0], pairs[inverse, 1]))
    return units


def interrupt_stretch(work: np.ndarray, flows_start: np.ndarray,
                      busy_until: np.ndarray) -> np.ndarray:
    """Seconds each rank's local work (compute and the straggler's delay, busy until
    ``busy_until``) is stretched by the interrupt ``work`` its sent bytes cost the host
    (``--link-cpu``): all of it where its flows start before that work ends, none where
    they start while it waits. The work is taken at the start of the flows: the sender's
    kernel segments and queues the bytes as MPI hands them over (on the emulated links
    ``tbf`` cuts each 64 KB segment into packets where its bucket is smaller), before
    the link carries them. Measured (lenet, 2 emulated nodes at 200 Mbit/s with a 51 KB
    bucket, 10.9 ns a byte, 246 KB a step each way): compute 8.3-8.8 ms a step against
    blocking SSGD's 3.7 on the same nodes, where the same bytes move while the ranks
    wait."""
    return np.where(flows_start < busy_until, work, 0.0)


def bucket_saving(burst: float, sent: np.ndarray, wire: float,
                  idle: np.ndarray) -> np.ndarray:
    """Seconds each rank's sent bytes of one exchange gain from its link's token bucket
    (``--link-burst`` bytes; 0: none) after ``idle`` seconds without sending: the bucket
    refilled at the link's rate (``sent / wire``, the exchange's own) holds
    ``min(burst, idle x rate)`` bytes, which pass at once, so the exchange's ``wire``
    seconds shrink by their share of ``sent`` (as :func:`~.collectives.burst_stages`
    takes a stage's, and :class:`~.collectives.RefilledAllreduce` a part-full bucket).
    Measured (mlp, a ring of 2 ranks on 2 emulated nodes at 1 Gbit/s, a 256 KB bucket,
    940 KB each way): the exchange took 6.5 ms from the post to the end of the wait
    against the wire's 7.9 (docs/RESULTS.md, "Hook calls timed, D-PSGD at a quota and
    the links' bucket")."""
    if burst <= 0 or wire <= 0:
        return np.zeros(len(sent))
    rate = np.divide(sent, wire, out=np.zeros(len(sent)), where=sent > 0)
    credit = np.minimum(burst, np.maximum(idle, 0.0) * rate)
    return wire * np.divide(np.minimum(credit, sent), sent, out=np.zeros(len(sent)),
                            where=sent > 0)


def dpsgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
          time_phase: PhaseClock) -> Timeline:
    """D-PSGD's timeline (``DPSGD.step``): copy the model into the send buffer and post,
    compute with a ``Testall`` at every hook call, delay, ``Wait``, mix and update (see
    the module docstring)."""
    w, n = local.workload, local.n
    schedule = graph_of(cfg, n)
    adj, nbytes, first = gossip_plan(cfg, w, schedule)
    exact = gossip_codec(str(getattr(cfg, "gossip_codec", "none") or "none")) is None
    used = sorted({j % len(adj) for j in range(first, steps)})  # the matrices that send
    peers = {k: adj[k].peers() for k in used}
    durations = {k: time_phase(GraphPhase(schedule.name, k, n, nbytes, tuple(adj[k].flows())))
                 if n > 1 else 0.0 for k in used}
    # the part of each exchange on the wire, beyond a 1-byte exchange's latency
    wires = {k: max(0.0, durations[k] - time_phase(GraphPhase(
        schedule.name, k, n, 1.0, tuple(adj[k].flows())))) if n > 1 else 0.0 for k in used}
    burst = burst_of(time_phase)
    sources = mix_sources(schedule)
    shares = w.compute_split().hooks
    # the host CPU each rank's sent bytes cost (interrupts), charged to its own work
    cpu = link_cpu(cfg) if n > 1 else 0.0
    sent = {k: np.array([len(d) for d in adj[k].dst], dtype=float) * nbytes for k in used}
    # a node's quota slows the copy, the mix and the kernel's work on the sent bytes as it
    # slows compute: CPU work of the rank's own (the workload's update has it already)
    quota = local.quota_stretch()
    units = mix_units(w, sources, gossip_elements(w))  # per matrix: (mix, copy) in updates
    rows, t = StepRows(n), np.zeros(n)
    # when each rank's last exchange ended (long ago before the first): its bucket refills
    idle_since = np.full(n, -1e30)
    for j in range(steps):
        k = j % len(adj)
        sends = j >= first
        data, comp, upd, delay = local.step(j)
        start = t.copy()
        mix_unit, copy_unit = units[j % len(units)]
        # GossipAverager.post's send[...] = params
        copy = upd * copy_unit * quota if exact else np.zeros(n)
        posted = start + data + copy
        poll_s = TESTALL_SECONDS if sends else 0.0
        _, computed = compute_polls(posted, comp, shares, poll_s)
        arrive = computed + delay
        wait, stretch = np.zeros(n), np.zeros(n)
        if sends:
            both = np.maximum(posted[:, None], posted[peers[k]]).max(axis=1)
            stretch = interrupt_stretch(cpu * sent[k] * quota, both, arrive)
            arrive = arrive + stretch
            saved = bucket_saving(burst, sent[k], wires[k], both - idle_since)
            done = both + durations[k] - saved[peers[k]].min(axis=1)
            idle_since = done
            wait = np.maximum(done - arrive, 0.0)
        mix = upd * mix_unit * quota
        t = arrive + wait + mix + upd
        rows.add(step=j, t_start=start, t_data=data, t_compute=comp + stretch,
                 t_comm=copy + poll_s * len(shares), t_wait=wait, t_update=mix + upd,
                 t_delay=delay, samples=w.batch_size)
    degree = [max(len(d) for d in a.dst) for a in adj]
    notes = {"graph": schedule.name, "spectral_gap": schedule.spectral_gap(),
             "exchange_s": [durations[k] for k in sorted(durations)],
             "neighbour_bytes_per_step": [d * nbytes for d in degree],
             "mix_update_passes": [float(np.max(m)) for m, _ in units],
             "link_cpu_s_per_byte": cpu}
    return Timeline(rows, float(t.max()), notes)


# -- AD-PSGD ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PairsPhase:
    """Given (sender, receiver) pairs at once: AD-PSGD's transfers, keyed by its draw."""

    name: tuple
    n: int
    nbytes: float
    flows: tuple[tuple[int, int], ...] = field(repr=False, compare=False, default=())
    repeat: int = 1

    def key(self) -> tuple:
        return ("pairs", *self.name, self.n)

    def pairs(self) -> list[tuple[int, int]]:
        return list(self.flows)


def adpsgd_peers(mixing: Mixing, n: int, label: str = "") -> tuple[Adjacency, list[list[int]]]:
    """Every rank's bipartite peers (the code's ``bipartite_peers``, checked by its
    ``check_bipartite``: one line naming ``--graph label`` if some rank has none)."""
    adj = Adjacency.of(mixing)
    check_bipartite(adj, label)  # type: ignore[arg-type]
    return adj, [bipartite_peers(adj, r) for r in range(n)]  # type: ignore[arg-type]


def matching(peers: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    """(passive, active) pairs, each passive rank in one at most: the active ranks in order,
    each with its first peer not yet taken (the exclusive lock lets one average at a
    time reach a window, so the transfers that run at once have distinct targets)."""
    taken: set[int] = set()
    pairs = []
    for i in range(0, len(peers), 2):
        j = next((p for p in peers[i] if p not in taken), None)
        if j is not None:
            taken.add(j)
            pairs.append((j, i))
    return tuple(pairs)


def adpsgd_transfer(label: str, n: int, pairs: tuple[tuple[int, int], ...], nbytes: float,
                    time_phase: PhaseClock, burst: float = 0.0) -> tuple[float, float, float]:
    """(one-way latency, seconds of the model's bytes one way, the same with a full token
    bucket of ``burst`` bytes) of the ``pairs`` (from :func:`matching`) all transferring at
    once (SimGrid's, each with its route's latency). With the bucket the first ``burst``
    bytes go at the wire's speed: the transfer's time beyond the latency shrinks by
    ``min(burst, nbytes) / nbytes``, as :func:`~.collectives.burst_stages` takes a
    stage's; with several ranks a node, a pair on one node gains it too, which no link
    gives it: a small overstatement."""
    one_way = time_phase(PairsPhase((label, "latency"), n, COUNTER_BYTES, pairs))
    transfer = time_phase(PairsPhase((label, "model"), n, nbytes, pairs))
    bucketed = transfer
    if burst > 0 and nbytes > 0:
        bucketed -= max(0.0, transfer - one_way) * min(burst, nbytes) / nbytes
    return one_way, transfer, bucketed


@dataclass
class Meetings:
    """The driver's stop votes at AD-PSGD's meeting points (``StopVote``, ``StopOnSignal``).

    After every ``every`` steps of its own (and after its last) a rank posts an 8-byte
    ``Iallreduce`` and completes the one it posted ``lag`` points earlier (AD-PSGD's
    ``stop_vote_lag``), which ends ``vote_s`` after the last rank posted it: a rank ahead
    waits there for the slowest, so no rank runs more than about ``lag x every`` steps
    ahead. The wait is off the training clock (``StepContext.off_clock``): no phase, the
    next step starts later. ``every`` 0: no meetings.
    """

    n: int
    steps: int
    every: int
    lag: int
    vote_s: float
    posts: dict[int, list[float]] = field(default_factory=dict)
    held: dict[int, list[tuple[int, float]]] = field(default_factory=dict)
    waited: float = 0.0

    def point(self, taken: int) -> int:
        """The vote (1, 2, ...) a rank posts after ``taken`` steps; 0: none."""
        if self.every <= 0 or taken <= 0:
            return 0
        if taken % self.every == 0:
            return taken // self.every
        return taken // self.every + 1 if taken == self.steps else 0

    def done(self, vote: int) -> float:
        """When ``vote`` completes (every rank posted it)."""
        return max(self.posts[vote]) + self.vote_s

    def reach(self, rank: int, taken: int, t: float) -> list[tuple[int, float]]:
        """``rank`` ends its step ``taken - 1`` at ``t``: the (rank, start of its next step)
        of every rank that goes on now (it, or ranks held for the vote it completes)."""
        vote = self.point(taken)
        if vote == 0:
            return [(rank, t)]
        self.posts.setdefault(vote, []).append(t)
        go: list[tuple[int, float, float]] = []  # (rank, held since, goes on at)
        old = vote - self.lag
        if old < 1:
            go.append((rank, t, t))
        elif len(self.posts[old]) == self.n:
            go.append((rank, t, max(t, self.done(old))))
        else:
            self.held.setdefault(old, []).append((rank, t))
        if len(self.posts[vote]) == self.n:
            go += [(k, at, max(at, self.done(vote))) for k, at in self.held.pop(vote, [])]
        self.waited += sum(b - a for _, a, b in go)
        return [(k, b) for k, _, b in go]


#: Event kinds of :func:`adpsgd_events`, in the order of a rank's step.
LOCK, READ, UPDATE = range(3)


def adpsgd_events(n: int, steps: int, step_times: Any, peers: Sequence[Sequence[int]],
                  rng: np.random.Generator, one_way: float, transfer: float, epoch_s: float,
                  meetings: Meetings | None = None, serve_s: float = 0.0) -> list[tuple]:
    """Every rank's ``steps`` steps, each window's lock served in arrival order.

    ``step_times(k, j)``: rank k's (data, compute, update, delay) of its step j. An
    active rank's step: data, compute, delay, then the average: its lock request
    reaches the peer ``epoch_s + one_way`` later and is granted when the window is free;
    the peer's window stays locked for the grant's trip back, the Get's request and
    reply, and the Put (``2 one_way + 2 transfer``, ``transfer`` the mean of the Get's and
    the Put's, each holding its own latency); the unlock's acknowledgement returns
    ``one_way`` later; then the update on its own window (no one else locks it). A
    passive rank's step: data, a SHARED epoch on its own window to read the model (it
    waits while an average holds it), compute,
    delay, the update inside an EXCLUSIVE epoch on its own window (waits likewise, and
    holds it for the update's time). ``serve_s`` is the passive peer's expected wait
    for its next poll (``asgd.target_wait``), paid by each of the average's three
    requests the peer must serve inside MPI over TCP: the lock's grant before it, the
    Get and the Put with the unlock while the window is held. At each meeting point
    (``meetings``) a rank waits for its stop vote before its next step
    (:class:`Meetings`). Returns one record per step:
    ``(rank, step, t_start, data, compute, update, delay, comm, wait)``.
    """
    free = [0.0] * n  # when each window's lock is next free
    heap: list[tuple[float, int, int, int]] = []
    # per rank: its step, the step's start, local times, wait so far, the request's departure
    state: list[list[Any]] = [[0, 0.0, None, 0.0, 0.0] for _ in range(n)]
    records: list[tuple] = []
    seq = 0

    def begin(k: int, t: float) -> None:
        nonlocal seq
        st = state[k]
        if st[0] >= steps:
            return
        st[1], st[2], st[3] = t, step_times(k, st[0]), 0.0
        d, c, u, dl = st[2]
        if k % 2 == 0:
            st[4] = t + d + c + dl  # the request leaves
            heapq.heappush(heap, (st[4] + epoch_s + one_way + serve_s, seq, k, LOCK))
        else:
            heapq.heappush(heap, (t + d, seq, k, READ))
        seq += 1

    def ends(k: int, t: float) -> None:  # rank k ended a step at t
        state[k][0] += 1
        for rank, go in (meetings.reach(k, state[k][0], t) if meetings else [(k, t)]):
            begin(rank, go)

    for k in range(n):
        begin(k, 0.0)
    hold = 2.0 * one_way + 2.0 * transfer + 2.0 * serve_s
    while heap:
        at, _, k, kind = heapq.heappop(heap)
        st = state[k]
        d, c, u, dl = st[2]
        if kind == LOCK:
            j = peers[k][int(rng.integers(len(peers[k])))]
            grant = max(at, free[j])
            free[j] = grant + hold
            end = free[j] + one_way  # the unlock's acknowledgement
            records.append((k, st[0], st[1], d, c, u, dl, end - st[4] - (grant - at),
                            grant - at))
            ends(k, end + u)
        elif kind == READ:
            grant = max(at, free[k])
            st[3] = grant - at
            heapq.heappush(heap, (grant + c + dl, seq, k, UPDATE))
            seq += 1
        else:  # UPDATE
            grant = max(at, free[k])
            free[k] = grant + u
            records.append((k, st[0], st[1], d, c, u, dl, 0.0, st[3] + grant - at))
            ends(k, free[k])
    return records


def adpsgd(cfg: argparse.Namespace, local: LocalTimes, steps: int,
           time_phase: PhaseClock) -> Timeline:
    """AD-PSGD's timeline: ``steps`` steps on every rank, each at its own pace (see the
    module docstring); one random peer per average, drawn from ``--seed``; the ranks
    meet every ``--meet-every`` steps (:class:`Meetings`, its vote an 8-byte nonblocking
    allreduce on the platform)."""
    w, n = local.workload, local.n
    schedule = graph_of(cfg, n)
    adj, peers = adpsgd_peers(schedule.cycle[0], n, schedule.name)
    costs = costs_from(cfg)
    rng = np.random.default_rng([int(getattr(cfg, "seed", 0)), 1710])
    nbytes = float(w.param_bytes)
    label = f"adpsgd:{schedule.name}"
    # the Get's reply leaves the passive target as it progresses; the Put leaves the active
    # rank, which drives it from inside MPI, and finds its link's bucket full
    one_way, get_s, put_s = adpsgd_transfer(label, n, matching(peers), nbytes, time_phase,
                                            burst_of(time_phase))
    transfer = 0.5 * (get_s + put_s)
    local.ensure(steps)
    strategy = get_algorithm("adpsgd")
    every = int(getattr(cfg, "meet_every", None) or strategy.Options.meet_every)
    vote_s = cost(placed_phases(VOTE_BYTES, n, "auto", time_phase, VOTE_BYTES,
                                nonblocking=True), time_phase) if n > 1 else 0.0
    meetings = Meetings(n, steps, every, strategy.traits.stop_vote_lag, vote_s)
    serve_s = 0.0
    if rma_progress(cfg) == "polls" and n > 1:  # the passive ranks serve at their polls
        d, c, u, dl = (float(x) for x in local.cols[1::2, :steps, :].mean(axis=(0, 1)))
        polled = local.polled_delay(slice(1, None, 2), steps)
        stretch = float(np.mean(local.quota_stretch()[1::2]))
        serve_s = target_wait(poll_gaps(d, c, u, dl, w.compute_split().hooks, polled=polled,
                                        stretch=stretch), 1.0)
    records = adpsgd_events(n, steps, lambda k, j: local.rank(k, j).tolist(), peers, rng,
                            one_way, transfer, costs.epoch_s, meetings, serve_s)
    table = np.asarray(records, dtype=float).reshape(-1, 9)
    order = np.lexsort((table[:, 1], table[:, 0]))
    table = table[order]
    rows = StepRows(n)
    names = ("t_start", "t_data", "t_compute", "t_update", "t_delay", "t_comm", "t_wait")
    rows.add(table[:, 0].astype(np.int64), step=table[:, 1].astype(np.int64),
             samples=w.batch_size, **{name: table[:, 2 + i] for i, name in enumerate(names)})
    ends = table[:, 2:].sum(axis=1)
    notes = {"graph": schedule.name, "one_way_latency_s": one_way, "model_transfer_s": transfer,
             "lock_hold_s": 2.0 * one_way + 2.0 * transfer + 2.0 * serve_s,
             "rma_epoch_s": costs.epoch_s, "rma_progress": rma_progress(cfg),
             "peer_poll_wait_s": serve_s,
             "averages": int(np.count_nonzero(table[:, 0] % 2 == 0)),
             "meet_every": every, "meetings": len(meetings.posts), "vote_s": vote_s,
             "meeting_wait_s": meetings.waited}
    return Timeline(rows, float(ends.max()) if len(ends) else 0.0, notes)
