"""ASGD: asynchronous SGD with the global parameters in MPI one-sided windows.

The rule (ALGORITHMS.md, "ASGD"; the parameter-server ASGD of Dean et al. 2012
without a server loop): each worker k repeatedly pulls (v_pre = version; W_k = W;
s_post = started), computes g_k on W_k, applies worker-side momentum
(u = mu_w * u + g_k + wd * W_k, ``MomentumSGD``'s convention) and pushes
(started++; W += -lr_w * u; v_push = version++), three epochs in turn. It records
``staleness`` = v_push - v_pre, an upper bound of the pushes between its pull and
its push (a push counts itself only after its Accumulate completed), and
``staleness_min`` = max(0, v_push - s_post), a true lower bound (``started``
counts a push before its Accumulate begins); both are 0 with one worker, where
ASGD is serial momentum SGD. Accumulate is element-wise atomic, so no push is
lost, and the pull reads with ``Get_accumulate(NO_OP)``: MPI-3.1/4.1 section 12.7
leave a ``Get`` racing an ``Accumulate`` undefined, only accumulate-type calls are
atomic with each other (the windows' ``accumulate_ops=same_op_no_op`` hint).

Step size: W workers that each take a full momentum step move the weights W
times as far per SSGD-equivalent step, and asynchrony adds an implicit momentum
of its own (Mitliagkas et al. 2016, arXiv 1605.09774), so ``--worker-momentum``
defaults to 0.5 (a push's memory is two pushes, not ten), stable under MPICH
and Open MPI alike (docs/RESULTS.md, "ASGD's defaults on two MPI libraries");
``--async-lr-scale workers`` divides the effective step among the workers
(:func:`worker_learning_rate`). ``--delay-compensation LAMBDA`` (DC-ASGD, Zheng
et al. 2017, eq. 10) pushes g + LAMBDA * g*g*(W_now - W_k), with W_now fetched
in the push's own epoch, not approximated.

Windows, locks, progress, checkpoints and evaluation: :class:`ASGD` and
:mod:`syncbench.algorithms.windows`; the pull and push latencies measured per
MPI library are in docs/RESULTS.md ("ASGD's pull and push latencies").
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from syncbench.algorithms.base import StepStats, Strategy
from syncbench.algorithms.device_buffers import HostMirror
from syncbench.algorithms.flags import StrategyOptions, option, options_from
from syncbench.algorithms.mpi import MPI
from syncbench.algorithms.not_lock_step import NotLockStep
from syncbench.algorithms.optimizer import SubnormalFlush
from syncbench.algorithms.traits import StrategyTraits
from syncbench.algorithms.windows import LAYOUTS, Counters, ParamWindow, ProgressPoll
from syncbench.kernels.zoo import has_batchnorm

VERSION, CLAIMS, STARTED = 0, 1, 2
#: :meth:`ASGD.pause_point` of a pause dropped because the run ended early.
DROPPED_PAUSE = -1
#: Sleep between progress tests of a rank that only waits (host, done ranks).
POLL_INTERVAL_S = 1e-4
#: ``--rma-assert``: the ``MPI_Win_lock`` assertion by name (an ``MPI`` constant, or 0).
LOCK_ASSERTS = {"nocheck": "MODE_NOCHECK", "none": ""}
#: ``--async-lr-scale``: divide --lr by the number of workers, or not.
LR_SCALES = ("workers", "none")
DEFAULT_WORKER_MOMENTUM = 0.5


def lock_assert(name: str) -> int:
    """The assertion of ``--rma-assert NAME`` (read on a rank: it loads MPI)."""
    constant = LOCK_ASSERTS[name]
    return getattr(MPI, constant) if constant else 0


def worker_learning_rate(lr: float, momentum: float, worker_momentum: float, workers: int,
                         scale: str) -> float:
    """Each worker's step size: ``lr`` (``none``) or, for ``workers``, the rate at which
    the W workers' pushes add up to SSGD's effective step lr / (1 - mu).

    ``lr_w = lr * (1 - mu_w) / ((1 - mu) * W)``: a push's effective step
    lr_w / (1 - mu_w) is 1/W of SSGD's, and with ``mu_w = mu`` it is the
    usual ``lr / W`` of asynchronous workers.
    """
    if scale == "none":
        return lr
    if momentum >= 1:  # no finite effective step to match: plain 1/W
        return lr / workers
    return lr * (1.0 - worker_momentum) / ((1.0 - momentum) * workers)


class ASGD(Strategy, NotLockStep):
    """ASGD over two windows (:mod:`syncbench.algorithms.windows`).

    Parameters: one ``Win.Allocate`` window of the model's dtype; ``--ps-layout
    sharded`` (default): rank r hosts the r-th contiguous 1/N slice; ``single``:
    rank 0 hosts everything and trains; ``dedicated``: rank 0 hosts everything and
    only drives MPI progress (no steps, no rows), the data sharded over the N-1
    workers (:meth:`data_shard`). Counters: an int64 window on rank 0 with
    [version, claims, started]; ``claims`` hands out step tickets (the first in
    :meth:`done`, the next with each push), and a worker stops when its ticket
    reaches ``Budget.total_samples // batch_size``, so exactly the sample budget is
    pushed however the ranks' speeds differ. Every access is ``Lock(owner,
    LOCK_SHARED)`` per owner, the operations, then ``Unlock`` per owner (the shards
    move concurrently); only shared locks are taken, so ``MPI_MODE_NOCHECK``
    (``--rma-assert nocheck``, the default) is valid and removes the lock handshake.
    The windows are allocated in :meth:`prepare`, before the clock starts, and the
    latency report gathered in :meth:`close`, after it stops.

    Progress: where the transport needs the target inside MPI, a worker enters MPI
    between layers (``Iprobe`` in the model's hooks) and a rank that is done keeps
    doing so (an ``Ibarrier`` tested every :data:`POLL_INTERVAL_S`); the straggler's
    injected delay does not poll (use ``dedicated`` when a host rank is slowed).

    Checkpoints pause every worker at each multiple of S * N tickets
    (:meth:`pause_point`); evaluations are of the weights rank 0 pulled, kept when
    they cross an evaluation stride (:meth:`snapshot_point`) and evaluated after
    training; the final model is every shard gathered (:meth:`consensus_params`).
    """

    name = "asgd"
    summary = ("asynchronous SGD: parameters in MPI RMA windows, atomic "
               "Get_accumulate/Accumulate pull/push")
    #: Its ranks never stop together: the accuracy curve is evaluated after training,
    #: from weights kept during it (``--target-accuracy`` alone works); which push a
    #: pull sees depends on the ranks' timing; ranks step independently (no
    #: ``--sync-bn``). A step pulls the weights, computes, then pushes: its comm is split
    #: around compute, half before it (drawn once, before compute); evaluations are of
    #: the pulled copies kept during training, evaluated after it.
    traits = StrategyTraits(
        step_order=("data", "comm", "wait", "compute", "delay", "update"),
        split_phases={"comm": 0.5}, snapshot_evaluations=True, simulation="asgd",
        supports_stop_at_target=False, deterministic=False, lock_step=False,
        local_optimizers=("sgd",))

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        """ASGD's options."""

        ps_layout: str = option(
            "sharded", "ASGD parameter windows: sharded (every rank hosts 1/N, default), single "
            "(rank 0 hosts all and trains) or dedicated (rank 0 hosts all, only serves)",
            choices=LAYOUTS)
        delay_compensation: float = option(
            0.0, "ASGD DC-ASGD: push g + LAMBDA*g*g*(W_now - W_pulled) (default 0: off)",
            metavar="LAMBDA")
        rma_assert: str = option(
            "nocheck", "ASGD MPI_Win_lock assert: nocheck (default; valid, every lock is shared) "
            "or none (the target grants each lock inside MPI)", choices=tuple(LOCK_ASSERTS))
        async_lr_scale: str = option(
            "none", "ASGD worker step size: none (default: --lr) or workers "
            "(lr*(1-worker_momentum)/((1-momentum)*W) for W workers, so their pushes add up to "
            "SSGD's effective step; lr/W when the momenta are equal)", choices=LR_SCALES)
        worker_momentum: float = option(
            DEFAULT_WORKER_MOMENTUM, "ASGD momentum of each worker's update (default "
            f"{DEFAULT_WORKER_MOMENTUM}: asynchrony adds an implicit momentum of its own)")

        def __post_init__(self) -> None:
            if not self.delay_compensation >= 0:
                raise ValueError(
                    f"--delay-compensation must be >= 0, got {self.delay_compensation}")
            if not 0 <= self.worker_momentum < 1:
                raise ValueError(
                    f"--worker-momentum must be in [0, 1), got {self.worker_momentum}")

        def check_run(self, config: Any, world_size: int) -> None:
            """The dedicated layout needs a host and a worker, and a host that trains
            for a BatchNorm model (running statistics are not pushed: each worker keeps
            its own, and rank 0, which evaluates, uses its own)."""
            if self.ps_layout == "dedicated" and world_size < 2:
                raise ValueError(
                    "--ps-layout dedicated needs at least 2 ranks (a host and a worker)")
            if self.ps_layout == "dedicated" and has_batchnorm(config.model):
                raise ValueError(f"asgd --ps-layout dedicated cannot train {config.model}: "
                                 "BatchNorm's running statistics stay on the workers, and "
                                 "rank 0, which evaluates, trains nothing (use sharded or "
                                 "single)")

    @classmethod
    def data_shard(cls, config: Any, rank: int, size: int) -> tuple[int, int]:
        """Dedicated layout: the data is sharded over the N-1 workers (rank 0 never trains)."""
        if options_from(cls.Options, config).ps_layout == "dedicated" and size > 1:
            return max(rank - 1, 0), size - 1
        return rank, size

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        model, config, options = self.model, self.config, self.options
        self.layout: str = options.ps_layout
        decay = self.optimizer.decay  # a number, or per element (--wd-exempt): host memory
        self._decay = decay if np.isscalar(decay) else model.backend.to_numpy(decay)
        self.is_host = self.layout == "dedicated" and self.comm.rank == 0
        self.workers = self.comm.size - (1 if self.layout == "dedicated" else 0)
        self.total_pushes = self.budget.total_samples // self.budget.batch_size
        #: The worker's step size and momentum (``--async-lr-scale``, ``--worker-momentum``).
        self.worker_momentum = float(options.worker_momentum)
        self.worker_lr = worker_learning_rate(
            config.lr, config.momentum, self.worker_momentum, self.workers, options.async_lr_scale
        )
        self.dc = float(options.delay_compensation)
        self._lock_assert = lock_assert(options.rma_assert)
        self._on_host = not model.backend.is_gpu
        n, dtype = model.size, model.dtype
        # W_pulled lives in model.params on the CPU (the read lands there directly); on
        # the GPU in a pinned mirror of them, and the gradient is read through another.
        self._param_mirror = None if self._on_host else HostMirror(model.backend, model.params)
        self._grad_mirror = None if self._on_host else HostMirror(model.backend, model.grads)
        self._pulled = model.params if self._on_host else self._param_mirror.host
        self._velocity = np.zeros(n, dtype)
        self._delta = np.zeros(n, dtype)
        self._scratch = np.zeros(n, dtype)
        self._flush = SubnormalFlush()
        self._g = np.zeros(n, dtype) if self.dc else None
        self._w_now = np.zeros(n, dtype) if self.dc else None
        # bytes a worker hands to MPI per step: the pull's read of every shard, the push's
        # Accumulate, and with DC the read of W_now (the counters' 8-byte atomics left out)
        self.run_attributes["wire_bytes_per_step"] = int(n * dtype.itemsize
                                                         * (3 if self.dc else 2))
        # MPI resources are made in prepare() (collective): the driver agrees on
        # setup errors after __init__, so a collective here could deadlock with a
        # rank whose setup failed.
        self._mpi: MPI.Comm | None = None
        self.windows: ParamWindow | None = None
        self.counters: Counters | None = None
        self._ticket: int | None = None
        self._exhausted = self.is_host
        self._finished = self._closed = False
        self._v_pull = self._started_post = 0
        # checkpoint pauses every --checkpoint-every * N tickets (none without it)
        self._pause_stride = int(config.checkpoint_every or 0) * self.comm.size
        self._next_pause = self._pause_stride if self._pause_stride else self.total_pushes
        self._restored: dict[str, Any] | None = None
        #: Tickets handed out when this rank ended the run early (-1: it did not).
        self._stop_point = -1
        #: The agreed stop point after an early end (:meth:`early_end_point`), else None.
        self._stopped_at: int | None = None
        #: The stop point agreed at the last pause (-1: no early end before it).
        self._pause_stop = -1
        self._asked_to_stop = False
        self.pull_seconds: list[float] = []
        self.push_seconds: list[float] = []
        self.staleness: list[int] = []
        self.staleness_min: list[int] = []
        #: Rank 0 after close(): run-wide latency and staleness figures.
        self.report: dict[str, float] = {}

    # -- windows --------------------------------------------------------------
    def prepare(self) -> None:
        """Allocate the windows and publish W0 or the restored state (collective, once)."""
        if self._mpi is not None:
            return
        self._mpi = self.comm.mpi_comm.Dup()
        self._progress = ProgressPoll(self._mpi, self.timer)
        self.windows = ParamWindow(
            self._mpi, self.model.size, self.model.dtype, self.layout, self._lock_assert,
            events=getattr(self.comm, "events", None), timer=self.timer,
        )
        self.counters = Counters(self._mpi, 3, self._lock_assert,
                                 events=getattr(self.comm, "events", None), timer=self.timer)
        restored = self._restored
        if restored is None:
            self.windows.set_local(self.model.backend.to_numpy(self.model.params))
        else:
            self.windows.set_shard(np.asarray(restored["window_shard"], self.model.dtype))
            counters = np.asarray(restored["counters"], np.int64)
            if counters.size:  # at a pause every started push has landed: started = version
                counters = np.array([counters[VERSION], counters[CLAIMS], counters[VERSION]])
            self.counters.set_local(counters)
            self._restored = None
        self._mpi.Barrier()

    def end_early(self) -> bool:
        """Hand out the rest of the budget at once: every rank's next claim finds it gone.

        ``claims += 2 * total_pushes + size`` (one atomic): the tickets claimed
        before it, ``0..C-1``, are each pushed by their holder, so the window
        ends holding exactly the first ``C`` pushes; every later claim is past
        the budget. Only the first rank to do it gets ``C < total_pushes`` and
        remembers it as the stop point, which a checkpoint pause agrees on
        (:meth:`pause_point`). False when the budget was already handed out.
        """
        self.prepare()
        if self._asked_to_stop:  # once per rank
            return False
        self._asked_to_stop = True
        claimed = self.counters.fetch_add(CLAIMS, 2 * self.total_pushes + self.comm.size)
        if claimed >= self.total_pushes:
            return False
        self._stop_point = claimed
        return True

    def early_end_point(self) -> int | None:
        """The stop point ``C`` of :meth:`end_early`, agreed after :meth:`finish`.

        Every ticket before it has been pushed and none after, so the window
        and counters are those of a checkpoint pause at ``C``: :meth:`state`
        saves them as one, and ``--resume`` hands out ticket ``C`` next.
        """
        stop = self._agree_on_stop_point()
        if stop < 0:
            return None
        self._stopped_at = stop
        return stop * self.budget.batch_size

    def _claim(self, ticket: int) -> None:
        if ticket >= self.total_pushes:
            self._exhausted, self._ticket = True, None
        else:
            self._ticket = ticket

    def _wait_all(self) -> None:
        """Every rank gets here (Ibarrier tested with short sleeps: drives RMA progress).

        A rank that waits here for the others (the dedicated host from the start, a
        worker whose share is done) still ends the run early when a signal asks it to
        (:meth:`stop_requested`): the others find the budget gone at their next claim.
        """
        self._complete(self._mpi.Ibarrier(), self._end_early_if_asked)

    def _end_early_if_asked(self) -> None:
        if self.stop_requested():
            self.end_early()  # once: later calls return at once

    @staticmethod
    def _complete(request: MPI.Request, between: Callable[[], None] | None = None) -> None:
        """Test ``request`` with short sleeps until it completes (each test drives RMA
        progress on our windows); ``between`` runs before each sleep."""
        while not request.Test():
            if between is not None:
                between()
            time.sleep(POLL_INTERVAL_S)

    # -- the algorithm ----------------------------------------------------------
    def done(self) -> bool:
        """True once the budget is handed out and no checkpoint pause is left to join."""
        self.prepare()
        if not self._exhausted and self._ticket is None:
            self._claim(self.counters.fetch_add(CLAIMS))
        return self._exhausted and self._next_pause >= self.total_pushes

    def pause_point(self) -> int | None:
        """Global samples of the next checkpoint pause once this rank's next ticket reaches it.

        A worker holding a ticket at or past the pause point, a done worker
        and the dedicated host all stop there; every ticket before the point
        is pushed by then (a worker claims its next ticket only with a push),
        so the window holds exactly the first ``point`` pushes. Returns once
        every rank is there (an ``Iallreduce`` that drives progress and agrees on
        an early end: a pause past the stop point of :meth:`end_early` is
        dropped on every rank, and so are the ones after it): the wait
        for the last worker's step stays on the training clock, and the
        driver's checkpoint that follows, the same on every rank, is off it.
        """
        if not self._pause_stride or self._next_pause >= self.total_pushes:
            return None
        held = self.total_pushes if self._exhausted else self._ticket
        if held is None or held < self._next_pause:
            return None
        point = self._next_pause
        self._next_pause += self._pause_stride
        stop = self._pause_stop = self._agree_on_stop_point()
        if 0 <= stop < point:  # the run was ended early before this pause: no pauses left
            self._next_pause = self.total_pushes
            return DROPPED_PAUSE  # every rank here is exhausted: the driver re-checks done()
        return point * self.budget.batch_size

    def _agree_on_stop_point(self) -> int:
        """Every rank at a pause: the stop point of :meth:`end_early`, or -1 (an
        ``Iallreduce(MAX)`` tested with short sleeps, which drives RMA progress)."""
        mine = np.array([self._stop_point], np.int64)
        agreed = np.zeros(1, np.int64)
        self._complete(self._mpi.Iallreduce(mine, agreed, op=MPI.MAX))
        return int(agreed[0])

    def pull(self) -> None:
        """W_pulled = W, remembering the version before it and the pushes started after it."""
        self.prepare()
        with self.timer.phase("comm"):
            start = time.perf_counter()
            self._v_pull = self.counters.read(VERSION)
            self.windows.pull(self._pulled)
            self._started_post = self.counters.read(STARTED)
            self.pull_seconds.append(time.perf_counter() - start)
        if not self._on_host:
            with self.timer.phase("update"):
                self._param_mirror.push(self.model.params)

    def compute(self, x: Any, y: Any) -> float:
        """Gradient of the mini-batch on W_pulled into ``model.grads``; returns the loss."""
        with self.timer.phase("compute"):
            loss = self.model.loss_and_grad(
                x, y, on_grads_ready=self._progress, poll=self._progress
            )
        self.straggle()
        return loss

    def _update(self, grads: np.ndarray) -> None:
        """delta = -lr_w * u with u = mu_w*u + g' + wd*W_pulled (g' = DC-compensated g)."""
        if self.dc:
            g = self._g
            np.subtract(self._w_now, self._pulled, out=g)
            g *= grads
            g *= grads
            g *= self.dc
            g += grads
            grads = g
        self._velocity *= self.worker_momentum
        self._velocity += grads
        if self.config.weight_decay:
            self._velocity += np.multiply(self._pulled, self._decay, out=self._scratch)
        self._flush(self._velocity, self._scratch)
        np.multiply(self._velocity, -self.worker_lr, out=self._delta)

    def push(self) -> tuple[int, int]:
        """started++, W += delta, version++ (and claim the next ticket); the staleness bounds."""
        grads = self.model.grads if self._on_host else self._grad_mirror.pull(self.model.grads)
        if not self.dc:
            with self.timer.phase("update"):
                self._update(grads)
        with self.timer.phase("comm"):
            start = time.perf_counter()
            self.start_push()
            dc_seconds = self.land_push(grads)
            bounds = self.count_push()
            self.push_seconds.append(time.perf_counter() - start - dc_seconds)
        return bounds

    def start_push(self) -> None:
        """``started += 1`` (its epoch completes before the Accumulate's epoch begins)."""
        self.counters.fetch_add(STARTED)

    def land_push(self, grads: np.ndarray) -> float:
        """The Accumulate epoch (DC: fetch W_now, compensate, then Accumulate); DC seconds."""
        dc_seconds = 0.0
        with self.windows.epoch():
            if self.dc:
                self.windows.Get_accumulate(self._w_now)
                self.windows.Flush()
                dc_start = time.perf_counter()
                with self.timer.phase("update"):
                    self._update(grads)
                dc_seconds = time.perf_counter() - dc_start
            self.windows.Accumulate(self._delta)
        return dc_seconds

    def count_push(self) -> tuple[int, int]:
        """``version += 1``, claim the next ticket; records and returns (upper, lower) bounds."""
        version, ticket = self.counters.Fetch_and_op(
            [(VERSION, 1, MPI.SUM), (CLAIMS, 1, MPI.SUM)]
        )
        self._claim(ticket)
        bounds = version - self._v_pull, max(0, version - self._started_post)
        self.staleness.append(bounds[0])
        self.staleness_min.append(bounds[1])
        return bounds

    def step(self, x: Any, y: Any) -> StepStats:
        self.pull()
        loss = self.compute(x, y)
        upper, lower = self.push()
        self.steps_taken += 1
        return StepStats(loss=loss, samples=int(x.shape[0]), staleness=upper,
                         staleness_min=lower)

    def evaluation_point(self) -> int | None:
        """None: the ranks are never at the same point while training."""
        return None

    def snapshot_point(self) -> int | None:
        """Samples in the weights of the last pull (``model.params`` on the host)."""
        if not self.steps_taken:
            return None
        return self._v_pull * self.budget.batch_size

    def finish(self) -> None:
        """Wait for every rank while driving progress (Ibarrier + Test + sleep)."""
        self.prepare()
        if self._finished:
            return
        self._wait_all()
        self._finished = True

    def global_version(self) -> int:
        """Pushes so far (the version counter)."""
        self.prepare()
        return self.counters.read(VERSION)

    def consensus_params(self) -> Any:
        """The window contents on every rank (collective; call after :meth:`finish`)."""
        self.prepare()
        return self.model.backend.asarray(self.windows.gather())

    # -- checkpoints -----------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """This rank's state at a pause: every push before it has landed.

        Adds the rank's window shard, rank 0's counters, the ticket it holds
        and its latency and staleness lists to the base state (W_pulled, the
        worker velocity, steps). Called by the driver right after
        :meth:`pause_point`, whose wait for every rank (no RMA since) is what
        makes the window and counters complete here; no rank pushes again
        before the driver's barrier after every rank saved.
        """
        counters, exhausted, next_pause = (
            self.counters.read_local(), self._exhausted, self._next_pause)
        ticket = -1 if self._ticket is None else self._ticket
        stop = self._stopped_at if self._stopped_at is not None else self._pause_stop
        if stop >= 0:
            # ended early at C: claims is C (not C + the jump), and a worker the jump left
            # without a ticket claims again when resumed. After finish (stopped_at) every
            # ticket before C has landed: a pause at C; at an earlier pause P the tickets
            # P..C-1 are still held by the ranks, saved with them.
            if counters.size:
                counters[CLAIMS] = stop
            exhausted = self.is_host
        if self._stopped_at is not None:
            if counters.size:
                counters[VERSION] = counters[STARTED] = stop
            ticket = -1
            stride = self._pause_stride
            next_pause = (stop // stride + 1) * stride if stride else self.total_pushes
        return {
            **super().state(),
            "velocity": self._velocity.copy(),  # the worker's (the optimizer's is unused)
            "window_shard": self.windows.read_local(),
            "counters": counters,
            "ticket": ticket,
            "exhausted": int(exhausted),
            "next_pause": next_pause,
            "pull_seconds": np.asarray(self.pull_seconds, np.float64),
            "push_seconds": np.asarray(self.push_seconds, np.float64),
            "staleness": np.asarray(self.staleness, np.int64),
            "staleness_min": np.asarray(self.staleness_min, np.int64),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state` on the same rank; the windows are filled in :meth:`prepare`."""
        super().load_state(state)
        self._velocity[...] = np.asarray(state["velocity"])
        ticket = int(state["ticket"])
        self._ticket = None if ticket < 0 else ticket
        self._exhausted = bool(state["exhausted"])
        # a resumed run pauses at the strides of its own --checkpoint-every (if any)
        if self._pause_stride:
            self._next_pause = int(state["next_pause"])
        for name in ("pull_seconds", "push_seconds", "staleness", "staleness_min"):
            setattr(self, name, np.asarray(state[name]).ravel().tolist())
        self._restored = {"window_shard": np.asarray(state["window_shard"]).ravel(),
                          "counters": np.asarray(state["counters"]).ravel()}

    # -- end of training -------------------------------------------------------
    def report_line(self) -> str | None:
        """Gather latencies and staleness bounds; rank 0 gets one ``asgd:`` line (collective).

        Also kept as :attr:`report` (a dict) on rank 0, and in the run file as the root
        attribute ``asgd_report`` (JSON).
        """
        mine = (np.asarray(self.pull_seconds), np.asarray(self.push_seconds),
                np.asarray(self.staleness, dtype=np.int64),
                np.asarray(self.staleness_min, dtype=np.int64))
        gathered = self._mpi.gather(mine, root=0)
        if gathered is None:
            return None
        pull, push, stale, stale_min = (np.concatenate(parts) for parts in zip(*gathered))
        if not pull.size:
            return None
        report = {"pushes": float(push.size)}
        for label, values in (("pull", pull), ("push", push)):
            for q in (50, 90):
                report[f"{label}_p{q}_ms"] = float(np.percentile(values, q) * 1e3)
            report[f"{label}_max_ms"] = float(values.max() * 1e3)
        for label, values in (("staleness", stale), ("staleness_min", stale_min)):
            report[f"{label}_mean"] = float(values.mean())
            report[f"{label}_max"] = float(values.max())
        self.report = report
        # rank 0 writes the run file's root after the hooks' on_end (this call); the name
        # is analysis.schema.ASGD_REPORT_ATTR (algorithms/ does not import analysis/)
        self.run_attributes["asgd_report"] = json.dumps(report)
        return (
            f"asgd: layout {self.layout} assert {self.options.rma_assert} "
            f"pushes {push.size}  pull ms p50 {report['pull_p50_ms']:.3f} "
            f"p90 {report['pull_p90_ms']:.3f} max {report['pull_max_ms']:.2f}  "
            f"push ms p50 {report['push_p50_ms']:.3f} p90 {report['push_p90_ms']:.3f} "
            f"max {report['push_max_ms']:.2f}  staleness mean {report['staleness_mean']:.2f} "
            f"max {int(report['staleness_max'])} (lower bound mean "
            f"{report['staleness_min_mean']:.2f} max {int(report['staleness_min_max'])})"
        )

    def close(self) -> None:
        """Free the windows and the communicator (the driver reported, :meth:`report_line`).

        Collective. On an error path (an exception is propagating through the
        caller) the other ranks are not here to join the collectives; the
        driver's ``MPI_Abort`` reclaims the windows instead of a hang.
        """
        if self._closed or self._mpi is None:
            self._closed = True
            return
        self._closed = True
        if sys.exc_info()[1] is not None:
            return
        self.windows.Free()
        self.counters.Free()
        self._mpi.Free()
