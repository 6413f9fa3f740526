"""ASGD: asynchronous SGD with the global parameters in MPI one-sided windows.

The rule (ALGORITHMS.md, "ASGD"; the parameter-server ASGD of Dean et al.
2012 without a server loop): the global weights W live in MPI RMA windows.
Each worker k repeatedly

1. pulls:   v_pull = counter; W_k = W                 (Fetch_and_op NO_OP; Get)
2. computes g_k on W_k with its mini-batch
3. applies worker-side momentum (the PyTorch convention of ``MomentumSGD``):
   u = mu * u + g_k + wd * W_k
4. pushes:  W += -lr * u; v_push = counter++           (Accumulate SUM; Fetch_and_op SUM)

and records staleness = v_push - v_pull, the number of other pushes that
landed between its pull and its push (0 with one worker, where ASGD is
exactly serial momentum SGD). Accumulate is element-wise atomic, so no push
is lost however many workers push at once.

``--delay-compensation LAMBDA`` (DC-ASGD, Zheng et al. 2017, eq. 10) pushes
g + LAMBDA * g*g*(W_now - W_k) instead of g. W_now is FETCHED, not
approximated: the push epoch first Gets the current weights, flushes, builds
the compensated update and then Accumulates it, all inside the same SHARED
lock epoch (it costs one more transfer of the parameters per step).

Windows and locks (module :mod:`syncbench.algorithms.windows`):

* parameters: one ``Win.Allocate`` window of the model's dtype. ``--ps-layout
  sharded`` (default): rank r hosts the r-th contiguous 1/N slice;
  ``single``: rank 0 hosts everything and also trains; ``dedicated``: rank 0
  hosts everything and only drives MPI progress until the job is done (it
  takes no steps and records no rows), the other N-1 ranks are workers.
* counters: a second, int64 ``Win.Allocate`` window on rank 0 with
  [version, claims]. ``version`` counts completed pushes; ``claims`` hands
  out step tickets: a worker claims its first ticket in ``done()`` and the
  next one with each push (same epoch as the version increment), and stops
  when its ticket reaches ``Budget.total_samples // batch_size``. So exactly
  the sample budget is pushed, however the ranks' speeds differ.
* every access is ``Lock(owner, LOCK_SHARED)`` per owner, the operations,
  then ``Unlock`` per owner (locking all owners first lets the shards move
  concurrently). Only shared locks are ever taken, so ``MPI_MODE_NOCHECK`` is
  valid and is the default (``--rma-assert nocheck``): it removes the lock
  handshake that otherwise waits for the target to enter MPI.

Progress: where the transport needs the target inside MPI (MPICH without
NOCHECK, or an active-message accumulate between nodes), the worker enters
MPI between layers (``Iprobe`` on a private communicator in the model's
``poll``/``on_grads_ready`` hooks), and a rank that is done keeps doing so
(an ``Ibarrier`` tested with 100 us sleeps) until every rank is done. The
straggler's injected sleep does not poll: use ``--ps-layout dedicated`` when
the transport needs target progress and a host rank is slowed.

Measured (2-core VM shared with other jobs, 4 ranks oversubscribed, MLP of
235k float32 = 0.94 MB, fashion-mnist, ``--rma-assert nocheck``, per-step
figures over all ranks, p50/p90):

=====================  ===================  ========================
library, layout        pull (ms)            push (ms)
=====================  ===================  ========================
MPICH 5.0.2, sharded   0.14 / 0.2 .. 3      2 .. 14 / 3 .. 25 (load)
MPICH, single          0.13 / 0.2           8 / 15
MPICH, dedicated       0.13 / 1.3           6 / 16
Open MPI 5.0.11, all   0.12 / 0.17          0.17 / 0.3
MPICH, ``none`` assert 26 / 48              35 / 55
=====================  ===================  ========================

MPICH performs the Accumulate inside ``Unlock`` through its generic reduce
path (about 1 GB/s; 0.3-1 ms for 0.94 MB even on one rank), and its tail
grows with the machine's load; Open MPI's osc/sm is 5-50x faster. A
microbenchmark with the target asleep outside MPI: 60k-float Get/Accumulate
complete in 0.09/0.04 ms with NOCHECK but block until the target wakes up
without it (MPICH's lock request needs the target). Rank 0 prints the pull
and push latencies and the staleness of every run at the end (one ``asgd:``
line on stdout); they are not run-file columns (the schema is unchanged).

Evaluation: ranks are never at the same point, so :meth:`evaluation_point`
is None during training. Instead :meth:`snapshot_point` tells the driver how
many samples the weights this rank pulled last include (the version at the
pull times the batch); rank 0 keeps a copy of its pulled weights each time
that crosses an evaluation stride and evaluates the copies after training,
with the times at which they were pulled (so the accuracy curve costs the
run nothing but a copy). With ``--ps-layout dedicated`` rank 0 does not
train and only the final evaluation is made. The final model,
:meth:`consensus_params` (after :meth:`finish`'s barrier), reads every shard
with ``Allgatherv`` of the owners' window memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import numpy as np
from mpi4py import MPI

from syncbench.algorithms.base import Algorithm, StepStats
from syncbench.algorithms.windows import LAYOUTS, Counters, ParamWindow

VERSION, CLAIMS = 0, 1
#: Sleep between progress tests of a rank that only waits (host, done ranks).
POLL_INTERVAL_S = 1e-4
#: Least time between two progress polls inside compute (Open MPI yields the
#: core in every poll when oversubscribed, so polling every layer is costly).
POLL_MIN_GAP_S = 5e-4
LOCK_ASSERTS = {"nocheck": MPI.MODE_NOCHECK, "none": 0}


class ASGD(Algorithm):
    name = "asgd"
    summary = "asynchronous SGD: parameters in MPI RMA windows, Get/Accumulate pull/push"

    @classmethod
    def add_arguments(cls, parser: argparse._ArgumentGroup) -> None:
        parser.add_argument(
            "--ps-layout", choices=LAYOUTS, default="sharded",
            help="ASGD parameter windows: sharded (every rank hosts 1/N, default), single "
            "(rank 0 hosts all and trains) or dedicated (rank 0 hosts all, only serves)",
        )
        parser.add_argument(
            "--delay-compensation", type=float, default=0.0, metavar="LAMBDA",
            help="ASGD DC-ASGD: push g + LAMBDA*g*g*(W_now - W_pulled) (default 0: off)",
        )
        parser.add_argument(
            "--rma-assert", choices=tuple(LOCK_ASSERTS), default="nocheck",
            help="ASGD MPI_Win_lock assert: nocheck (default; valid, every lock is shared) "
            "or none (the target grants each lock inside MPI)",
        )

    @classmethod
    def validate(cls, config: argparse.Namespace, world_size: int) -> None:
        if not config.delay_compensation >= 0:
            raise ValueError(
                f"--delay-compensation must be >= 0, got {config.delay_compensation}"
            )
        if config.ps_layout == "dedicated" and world_size < 2:
            raise ValueError("--ps-layout dedicated needs at least 2 ranks (a host and a worker)")
        if config.checkpoint_every or config.resume:
            raise ValueError(
                "asgd cannot --checkpoint-every or --resume: its workers never stop together, "
                "so there is no step at which the parameter store and every rank's state "
                "form one consistent snapshot"
            )
        if config.stop_at_target:
            raise ValueError(
                "asgd cannot --stop-at-target: its accuracy curve is evaluated after "
                "training, from weights kept during it (--target-accuracy alone works)"
            )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        model, config = self.model, self.config
        self.layout: str = config.ps_layout
        self.is_host = self.layout == "dedicated" and self.comm.rank == 0
        self.total_pushes = self.budget.total_samples // self.budget.batch_size
        self.dc = float(config.delay_compensation)
        self._lock_assert = LOCK_ASSERTS[config.rma_assert]
        self._on_host = not model.backend.is_gpu
        n, dtype = model.size, model.dtype
        # W_pulled lives in model.params on the CPU (Get lands there directly).
        self._pulled = model.params if self._on_host else np.empty(n, dtype)
        self._velocity = np.zeros(n, dtype)
        self._delta = np.zeros(n, dtype)
        self._scratch = np.zeros(n, dtype)
        self._g = np.zeros(n, dtype) if self.dc else None
        self._w_now = np.zeros(n, dtype) if self.dc else None
        # MPI resources are made lazily (collectively) at the first done()/step():
        # the driver agrees on setup errors after __init__, so a collective here
        # could deadlock with a rank whose setup failed.
        self._mpi: MPI.Comm | None = None
        self.windows: ParamWindow | None = None
        self.counters: Counters | None = None
        self._ticket: int | None = None
        self._exhausted = self.is_host
        self._finished = self._closed = False
        self._v_pull = 0
        self._last_poll = 0.0
        self.pull_seconds: list[float] = []
        self.push_seconds: list[float] = []
        self.staleness: list[int] = []
        #: Rank 0 after finish(): run-wide latency and staleness figures.
        self.report: dict[str, float] = {}

    # -- windows --------------------------------------------------------------
    def _start(self) -> None:
        """Allocate the windows and publish W0 (collective, once)."""
        if self._mpi is not None:
            return
        self._mpi = self.comm.comm.Dup()
        self.windows = ParamWindow(
            self._mpi, self.model.size, self.model.dtype, self.layout, self._lock_assert
        )
        self.counters = Counters(self._mpi, 2, self._lock_assert)
        self.windows.set_local(self.model.backend.to_numpy(self.model.params))
        self._mpi.Barrier()

    def _progress(self, _offset: int = 0) -> None:
        """Enter MPI (at most every ``POLL_MIN_GAP_S``) so that RMA on our windows progresses."""
        now = time.perf_counter()
        if now - self._last_poll < POLL_MIN_GAP_S:
            return
        with self.timer.phase("comm"):
            self._mpi.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
        self._last_poll = time.perf_counter()

    def _claim(self, ticket: int) -> None:
        if ticket >= self.total_pushes:
            self._exhausted, self._ticket = True, None
        else:
            self._ticket = ticket

    # -- the algorithm ----------------------------------------------------------
    def done(self) -> bool:
        """True once the global claims counter has handed out the whole budget."""
        self._start()
        if not self._exhausted and self._ticket is None:
            self._claim(self.counters.fetch_add(CLAIMS))
        return self._exhausted

    def pull(self) -> None:
        """W_pulled = W, remembering the version it includes."""
        self._start()
        with self.timer.phase("comm"):
            start = time.perf_counter()
            self._v_pull = self.counters.read(VERSION)
            self.windows.pull(self._pulled)
            self.pull_seconds.append(time.perf_counter() - start)
        if not self._on_host:
            with self.timer.phase("update"):
                self.model.params[...] = self.model.backend.asarray(self._pulled)

    def compute(self, x: Any, y: Any) -> float:
        """Gradient of the mini-batch on W_pulled into ``model.grads``; returns the loss."""
        with self.timer.phase("compute"):
            loss = self.model.loss_and_grad(
                x, y, on_grads_ready=self._progress, poll=self._progress
            )
        self.straggle()
        return loss

    def _update(self, grads: np.ndarray) -> None:
        """delta = -lr * u with u = mu*u + g' + wd*W_pulled (g' = DC-compensated g)."""
        config = self.config
        if self.dc:
            g = self._g
            np.subtract(self._w_now, self._pulled, out=g)
            g *= grads
            g *= grads
            g *= self.dc
            g += grads
            grads = g
        self._velocity *= config.momentum
        self._velocity += grads
        if config.weight_decay:
            self._velocity += np.multiply(self._pulled, config.weight_decay, out=self._scratch)
        np.multiply(self._velocity, -config.lr, out=self._delta)

    def push(self) -> int:
        """W += delta, version++ (and claim the next ticket); returns the staleness."""
        grads = self.model.backend.to_numpy(self.model.grads)
        if not self.dc:
            with self.timer.phase("update"):
                self._update(grads)
        with self.timer.phase("comm"):
            start = time.perf_counter()
            with self.windows.epoch():
                if self.dc:
                    self.windows.get(self._w_now)
                    self.windows.flush()
                    with self.timer.phase("update"):
                        self._update(grads)
                self.windows.accumulate(self._delta)
            version, ticket = self.counters.fetch_and_ops(
                [(VERSION, 1, MPI.SUM), (CLAIMS, 1, MPI.SUM)]
            )
            self.push_seconds.append(time.perf_counter() - start)
        self._claim(ticket)
        staleness = version - self._v_pull
        self.staleness.append(staleness)
        return staleness

    def step(self, x: Any, y: Any) -> StepStats:
        self.pull()
        loss = self.compute(x, y)
        staleness = self.push()
        self.steps_taken += 1
        return StepStats(loss=loss, samples=int(x.shape[0]), staleness=staleness)

    def evaluation_point(self) -> int | None:
        """None: the ranks are never at the same point while training."""
        return None

    def snapshot_point(self) -> int | None:
        """Samples in the weights of the last pull (``model.params`` on the host)."""
        if not self.steps_taken:
            return None
        return self._v_pull * self.budget.batch_size

    def finish(self) -> None:
        """Wait for every rank while driving progress (Ibarrier + Test + sleep), then report."""
        self._start()
        if self._finished:
            return
        request = self._mpi.Ibarrier()
        while not request.Test():
            time.sleep(POLL_INTERVAL_S)
        self._finished = True
        self._report()

    def global_version(self) -> int:
        """Pushes so far (the version counter)."""
        self._start()
        return self.counters.read(VERSION)

    def consensus_params(self) -> Any:
        """The window contents on every rank (collective; call after :meth:`finish`)."""
        self._start()
        return self.model.backend.asarray(self.windows.gather())

    def _report(self) -> None:
        """Gather pull/push latencies and staleness; rank 0 prints one ``asgd:`` line."""
        mine = (np.asarray(self.pull_seconds), np.asarray(self.push_seconds),
                np.asarray(self.staleness, dtype=np.int64))
        gathered = self._mpi.gather(mine, root=0)
        if gathered is None:
            return
        pull, push, stale = (np.concatenate(parts) for parts in zip(*gathered))
        if not pull.size:
            return
        report = {"pushes": float(push.size)}
        for label, values in (("pull", pull), ("push", push)):
            for q in (50, 90):
                report[f"{label}_p{q}_ms"] = float(np.percentile(values, q) * 1e3)
            report[f"{label}_max_ms"] = float(values.max() * 1e3)
        report["staleness_mean"] = float(stale.mean())
        report["staleness_max"] = float(stale.max())
        self.report = report
        print(
            f"asgd: layout {self.layout} assert {self.config.rma_assert} "
            f"pushes {push.size}  pull ms p50 {report['pull_p50_ms']:.3f} "
            f"p90 {report['pull_p90_ms']:.3f} max {report['pull_max_ms']:.2f}  "
            f"push ms p50 {report['push_p50_ms']:.3f} p90 {report['push_p90_ms']:.3f} "
            f"max {report['push_max_ms']:.2f}  staleness mean {report['staleness_mean']:.2f} "
            f"max {int(report['staleness_max'])}",
            flush=True,
        )

    def close(self) -> None:
        """Free the windows and the private communicator (collective).

        On an error path (an exception is propagating through the caller) the
        other ranks are not here to join the collective ``Win.Free``; the
        driver's ``MPI_Abort`` reclaims the windows instead of a hang.
        """
        if self._closed or self._mpi is None:
            self._closed = True
            return
        self._closed = True
        if sys.exc_info()[1] is not None:
            return
        self.windows.free()
        self.counters.free()
        self._mpi.Free()
