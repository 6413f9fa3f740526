"""AD-PSGD: asynchronous decentralized parallel SGD, atomic pairwise averaging.

Lian et al., ICML 2018 ("Asynchronous decentralized parallel stochastic gradient
descent", arXiv 1710.06952), Alg. 1: every worker i repeatedly

1. reads its model, x_hat_i <- x_i (possibly stale: it changes while the worker computes);
2. computes the gradient g_i of a mini-batch at x_hat_i;
3. averages its model with a random graph neighbour j, x_i, x_j <- (x_i + x_j) / 2,
   atomically for both;
4. applies the update of g_i to its (averaged) model, x_i <- x_i - gamma g_i.

No worker waits for all others and no step has a global collective: a slow worker slows
only the averages that wait on its lock. To rule out the deadlock of two workers each
starting an average with the other, the graph is split in two (ibid., section 4): even
ranks are *active* and start averages, odd ranks are *passive* and only take part in
them; a rank averages over the graph's edges that join it to the other parity
(:func:`~syncbench.algorithms.averagers.pairwise.bipartite_peers`, over every mixing
matrix of a time-varying graph). ``--graph`` without such a neighbour for some rank, or one
rank, is refused in one line.

Composition: the pairwise window
(:class:`~syncbench.algorithms.averagers.pairwise.PairwiseWindow`: every rank's model in
its own RMA window, an average holds both windows ``MPI_LOCK_EXCLUSIVE``, MPI-3.1 section
11.5.3) and the local optimizer (momentum SGD or AdamW). Step 4 is the optimizer's
update, computed at x_hat_i (its weight decay too) as a delta and added to the window
under the rank's own EXCLUSIVE lock (``x += delta``), so that an average that landed on
the model since step 1 is kept, not overwritten. The peer of each step is drawn from a
stream keyed by (``--seed``, rank, step): reproducible per rank, and resumed exactly with
no generator state.

Staleness (the rows' ``staleness``): the averages that changed this rank's model between
the read of step 1 and the update of step 4. Every average adds one to a count kept per
model (an int64 window), while it holds both models' locks; a rank reads its count under
its own model's lock at steps 1 and 4, so the difference is exact. An active rank's is 1
(its own average; passive ranks never change it), a passive rank's is the number of
averages its neighbours made with it meanwhile, 0 or more.

Lock step: every rank takes the same number of steps (the sample budget), and the ranks
meet at every ``--meet-every`` steps: those are the evaluation points. There the
driver's stop vote posts an 8-byte ``Iallreduce`` and completes the one posted two points
earlier (``stop_vote_lag`` 2), the only global collective while training, so no rank runs
more than about 2 x ``--meet-every`` steps ahead of the slowest; an evaluation or
checkpoint stride falls on the first meeting point past it. At an evaluation (or
checkpoint) the ranks settle (two ``Ibarrier`` tested with short sleeps, between which
each rank copies its window into ``model.params``: no average is in flight then), the
model evaluated is the average x_bar (one ``Allreduce``) and the consensus distance
(1/N) sum_i ||x_i - x_bar||^2 is logged as D-PSGD's (root attributes
``consensus_distance``, ``consensus_samples``; ``spectral_gap`` is the graph's).

Progress: a passive rank's window is the target of others' averages while it computes;
where the transport needs the target inside MPI (ofi/tcp across nodes), the rank enters
MPI between layers and during an emulated slowdown (``Iprobe``, at most every
:data:`~syncbench.algorithms.windows.POLL_MIN_GAP_S`), as ASGD's workers do
(:class:`~syncbench.algorithms.windows.ProgressPoll`). That is the one member of
:class:`~syncbench.algorithms.not_lock_step.NotLockStep` it answers otherwise than a
lock-step strategy (its ranks do not step together; the others keep their lock-step
defaults).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from syncbench.algorithms.averagers.gossip import consensus
from syncbench.algorithms.averagers.pairwise import PairwiseWindow, bipartite_peers
from syncbench.algorithms.base import StepStats, Strategy
from syncbench.algorithms.dpsgd import GraphOptions
from syncbench.algorithms.flags import option
from syncbench.algorithms.graphs import GraphSchedule, build_graph
from syncbench.algorithms.mpi import MPI
from syncbench.algorithms.not_lock_step import NotLockStep
from syncbench.algorithms.replica_scores import ReplicaReport
from syncbench.algorithms.traits import StrategyTraits
from syncbench.algorithms.windows import ProgressPoll

#: Sleep between the tests of a settling barrier (each test drives RMA progress).
POLL_INTERVAL_S = 1e-4
DEFAULT_MEET_EVERY = 10


def averaging_peers(schedule: GraphSchedule, rank: int) -> list[int]:
    """The ranks ``rank`` averages with: its neighbours of the other parity in any of the
    schedule's mixing matrices (the union over a time-varying graph's cycle)."""
    peers: set[int] = set()
    for mixing in schedule.cycle:
        peers.update(bipartite_peers(mixing, rank))
    return sorted(peers)


def check_peers(schedule: GraphSchedule, label: str) -> None:
    """``ValueError`` (one line) unless there are 2 ranks or more and every rank has a
    neighbour of the other parity (active ranks are even, passive ones odd)."""
    if schedule.size < 2:
        raise ValueError(f"--graph {label}: adpsgd averages pairs of ranks: it needs at "
                         "least 2 ranks")
    for rank in range(schedule.size):
        if not averaging_peers(schedule, rank):
            raise ValueError(f"--graph {label}: rank {rank} has no neighbour of the other "
                             "parity (adpsgd's active ranks are even, passive ones odd)")


def peer_at(peers: list[int], seed: int, rank: int, step: int) -> int:
    """The peer rank ``rank`` averages with at step ``step``: uniform over ``peers``, from
    a stream keyed by (seed, rank, step)."""
    return peers[int(np.random.default_rng((seed, rank, step)).integers(len(peers)))]


class AverageCounts:
    """Per rank, the number of averages its model took part in: an int64 RMA window.

    Changed only inside an average (both models' locks held) and read under the model's
    own lock, so a count always matches the model it counts (collective to build).
    """

    def __init__(self, mpi_comm: Any) -> None:
        self.rank = mpi_comm.Get_rank()
        self.win = MPI.Win.Allocate(8, 8, comm=mpi_comm)
        self._one = np.ones(1, np.int64)
        self._result = np.zeros(1, np.int64)
        with self._epoch(self.rank, exclusive=True):
            np.frombuffer(self.win.tomemory(), dtype=np.int64)[:1] = 0
        mpi_comm.Barrier()

    @contextmanager
    def _epoch(self, target: int, exclusive: bool = False) -> Iterator[None]:
        """A lock epoch on ``target``'s count: shared for accumulate-type calls, which are
        atomic with each other; exclusive for the plain store that zeroes it."""
        self.win.Lock(target, MPI.LOCK_EXCLUSIVE if exclusive else MPI.LOCK_SHARED)
        try:
            yield
        finally:
            self.win.Unlock(target)

    def bump(self, target: int) -> None:
        """``count[target] += 1`` (atomic: ``Accumulate`` SUM)."""
        with self._epoch(target):
            self.win.Accumulate(self._one, target, op=MPI.SUM)

    def read(self) -> int:
        """This rank's count (``Fetch_and_op`` NO_OP)."""
        with self._epoch(self.rank):
            self.win.Fetch_and_op(self._one, self._result, self.rank, op=MPI.NO_OP)
        return int(self._result[0])

    def close(self) -> None:
        self.win.Free()


class ADPSGD(Strategy, NotLockStep):
    name = "adpsgd"
    summary = ("asynchronous decentralized SGD (AD-PSGD): atomic pairwise averages with a "
               "random graph neighbour over MPI RMA windows, exclusive locks (--graph from "
               "dpsgd)")
    #: Ranks step at their own pace between meeting points, and which average lands
    #: before which read depends on their timing: no ``--sync-bn``, not bit-reproducible.
    #: The own read waits on the lock averages hold (``wait``), the average is ``comm``.
    traits = StrategyTraits(
        step_order=("data", "wait", "compute", "delay", "comm", "update"),
        simulation="adpsgd", deterministic=False, lock_step=False, stop_vote_lag=2)

    @dataclass(frozen=True)
    class Options(GraphOptions):
        """AD-PSGD's options (``--graph``: D-PSGD's)."""

        meet_every: int = option(
            DEFAULT_MEET_EVERY, "AD-PSGD: steps of one rank between the points where all "
            "ranks meet (stop votes; evaluations and checkpoints fall on the first meeting "
            f"point past their stride; default {DEFAULT_MEET_EVERY})", metavar="STEPS")

        def __post_init__(self) -> None:
            if self.meet_every < 1:
                raise ValueError(f"--meet-every must be >= 1, got {self.meet_every}")

        def check_run(self, config: Any, world_size: int) -> None:
            check_peers(build_graph(self.graph, world_size), self.graph)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        schedule = build_graph(self.options.graph, self.comm.size)
        check_peers(schedule, self.options.graph)
        self.run_attributes["spectral_gap"] = schedule.spectral_gap()
        self.rank = self.comm.rank
        self.peers = averaging_peers(schedule, self.rank)
        self.seed = int(self.config.seed)
        backend, model = self.model.backend, self.model
        self._mpi = self.comm.mpi_comm
        self.window = PairwiseWindow(self.comm, model.size, model.dtype)
        # an active (even) rank's average reads its peer's model (Get) and writes the mean
        # back (Put) once a step, a passive rank hands MPI nothing: the mean over ranks
        active = (self.comm.size + 1) // 2
        self.run_attributes["wire_bytes_per_step"] = int(
            2 * model.size * model.dtype.itemsize * active // self.comm.size)
        self.counts = AverageCounts(self._mpi)
        self._read = np.empty(model.size, model.dtype)  # x_hat_i, on the host
        self._next = backend.asarray(np.zeros(model.size, model.dtype))
        self.window.set_own(backend.to_numpy(model.params))
        self._mpi.Barrier()  # every window holds its model before any rank averages
        self._progress = ProgressPoll(self._mpi, self.timer)
        #: steps_taken at the last settle (every rank's window copied into its params).
        self._settled = -1
        #: The consensus distance and the ranks' own models' scores of every evaluation.
        self.replicas = ReplicaReport(self.run_attributes)
        self._closed = False
        #: This rank's steps, the sum and the largest of their staleness (checkpointed).
        self.staleness_totals = np.zeros(3, np.int64)

    # -- the algorithm -----------------------------------------------------------
    def drive_progress(self) -> None:
        """The emulated slowdown's polls: a straggling passive rank keeps its window's
        averages progressing, as it does between layers."""
        self._progress()

    def step(self, x: Any, y: Any) -> StepStats:
        backend, params = self.model.backend, self.model.params
        with self.timer.phase("wait"):  # x_hat_i and its count, under this rank's lock
            with self.window.own(exclusive=False) as own:
                self._read[...] = own
                count_read = self.counts.read()
        params[...] = backend.asarray(self._read)
        loss = self.compute_gradient(x, y, {"on_grads_ready": self._progress,
                                            "poll": self._progress})
        self.straggle()
        if self.window.active:
            peer = peer_at(self.peers, self.seed, self.rank, self.steps_taken)
            with self.timer.phase("comm"):
                self.window.average_with(peer, while_locked=lambda: self._bump(peer))
        with self.timer.phase("update"):
            self._next[...] = params
            self.optimizer.step(self._next, self.model.grads)  # at x_hat_i
            self._next -= params
            delta = backend.to_numpy(self._next)
            with self.window.own() as own:
                own += delta
                staleness = self.counts.read() - count_read
                params[...] = backend.asarray(own)  # this rank's model after its update
        self.steps_taken += 1
        totals = self.staleness_totals
        totals[0] += 1
        totals[1] += staleness
        totals[2] = max(int(totals[2]), staleness)
        return StepStats(loss=loss, samples=int(x.shape[0]), staleness=staleness)

    def _bump(self, peer: int) -> None:
        self.counts.bump(self.rank)
        self.counts.bump(peer)

    def evaluation_point(self) -> int | None:
        """Global samples at a meeting point (every ``--meet-every`` steps, and the last
        step), else None."""
        if self.steps_taken % self.options.meet_every and not self.done():
            return None
        return super().evaluation_point()

    # -- evaluation points ---------------------------------------------------------
    def _wait(self, request: Any) -> None:
        """Test ``request`` with short sleeps until it completes (each test drives the
        progress of averages targeting this rank)."""
        while not request.Test():
            time.sleep(POLL_INTERVAL_S)

    def settle(self) -> None:
        """Every rank's window copied into its ``model.params``, with no average in flight
        (collective, at a meeting point; once per point): a barrier after every rank's
        last step, the copy, a barrier before any rank's next step."""
        if self._settled == self.steps_taken:
            return
        self._wait(self._mpi.Ibarrier())
        self.model.params[...] = self.model.backend.asarray(self.window.read_own())
        self._wait(self._mpi.Ibarrier())
        self._settled = self.steps_taken

    def finish(self) -> None:
        self.settle()

    def consensus_params(self) -> Any:
        """x_bar, the average of every rank's model (collective; once per evaluation
        point), its consensus distance logged."""
        def settled_consensus() -> tuple[Any, float]:
            self.settle()
            return consensus(self)

        return self.replicas.consensus(self.steps_taken, self._global_samples,
                                       settled_consensus)

    def _global_samples(self) -> int:
        return self.steps_taken * self.budget.batch_size * self.comm.size

    def score_replicas(self, score: Any) -> None:
        """Every rank's own model (its window, settled) scored; their mean and worst kept
        (collective)."""
        self.settle()
        self.replicas.score(self.comm.mpi_comm, self._global_samples(), self.model.params,
                            score)

    # -- checkpoints -----------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """At a meeting point (collective): the rank's model (its window), the optimizer's
        state, the step (which keys the peer stream) and the consensus log."""
        self.settle()
        return {**super().state(), **self.replicas.state(),
                "staleness_totals": self.staleness_totals.copy()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state` on the same rank (collective: no rank averages before
        every window holds its restored model)."""
        super().load_state(state)
        self.window.set_own(self.model.backend.to_numpy(self.model.params))
        self.replicas.load_state(state)
        self.staleness_totals = np.asarray(state["staleness_totals"], np.int64).copy()
        self._settled = self.steps_taken
        self._wait(self._mpi.Ibarrier())

    def report_line(self) -> str | None:
        """Rank 0's ``adpsgd:`` line: the staleness over every rank's steps, and over the
        passive ranks' alone (an active rank's is always 1); collective, after training."""
        totals = self.staleness_totals
        passive = totals[:2] if not self.window.active else np.zeros(2, np.int64)
        sums = np.concatenate([totals[:2], passive])
        self._mpi.Allreduce(MPI.IN_PLACE, sums, op=MPI.SUM)
        largest = np.array([totals[2]], np.int64)
        self._mpi.Allreduce(MPI.IN_PLACE, largest, op=MPI.MAX)
        if self.rank != 0 or not sums[0]:
            return None
        passive_mean = sums[3] / sums[2] if sums[2] else float("nan")
        return (f"adpsgd: graph {self.options.graph} meet every {self.options.meet_every}  "
                f"staleness mean {sums[1] / sums[0]:.2f} (passive ranks {passive_mean:.2f}) "
                f"max {int(largest[0])}")

    def close(self) -> None:
        """Free the windows (collective). On an error path the other ranks are not here to
        join: the driver's ``MPI_Abort`` reclaims them instead of a hang."""
        if self._closed:
            return
        self._closed = True
        if sys.exc_info()[1] is not None:
            return
        self.counts.close()
        self.window.close()
