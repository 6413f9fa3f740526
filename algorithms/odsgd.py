"""OD-SGD: one-step-delay SGD (Xu, Dong, Xu, Liao 2020, arXiv 2005.06728).

Every rank keeps two copies of the weights: ``W_g``, the global weights,
identical on every rank (:attr:`ODSGD.w_global`), and ``W_loc``, the weights it
computes on (the model's ``params``). The recurrence is ALGORITHMS.md's
("OD-SGD"), the paper's Alg. 1 as its public MXNet code runs it
(CynthiaProtector/OD-SGD)::

    W_g = W_loc = W0
    t < warmup:   g = grad(W_loc); gsum = Allreduce(g)                # SSGD
                  W_g = GlobalOpt(W_g, gsum / N); W_loc = W_g
    t >= warmup:  g = grad(W_loc)                                     # one step stale
                  req_t = Iallreduce(g -> gsum_t)                     # overlaps step t+1
                  if t > warmup: Wait(req_{t-1}); W_g = GlobalOpt(W_g, gsum_{t-1} / N)
                  W_loc = W_g + LocalStep(W_g, g / N)
    finish():     Wait(req_last); W_g = GlobalOpt(W_g, gsum_last / N)

GlobalOpt is momentum SGD (``--lr``, ``--momentum``, ``--weight-decay``) on W_g,
the same update of the same reduced vector on every rank. LocalStep is the
paper code's local optimizer (``--local-opt``: MXNet's ``SGD``, the fork's
``DCASGD`` or ``CADCASGD``; :class:`ODSGD` gives each formula and the source it
follows). ``--warmup-steps`` plain SSGD steps come first (root attribute
``warmup_steps``). ``--local-lookahead on`` is our variant, not the paper's
(labelled ``odsgd+la``): W_loc predicts the next W_g, which restores SSGD's
stability where the paper's recurrence needs a far smaller step (:class:`ODSGD`).

Communication: step t's gradient is copied to one of two receive buffers and
reduced in place by an ``Iallreduce``, which the next step's forward and
backward poll between layers (``Testall``, charged to ``comm``); the blocking
part of the ``Wait`` is ``wait``. Every step is a lock-step point, and the
consensus model is W_g (one gradient behind until :meth:`ODSGD.finish`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from mpi4py import MPI

from syncbench.algorithms.base import Algorithm, StepStats
from syncbench.algorithms.flags import option

LOCAL_OPTS = ("sgd", "dc", "cadc")
#: ``--cadc-args``: the kernel's parameters bound by name, or as the fork launches them.
CADC_ARGS = ("named", "launched")
#: The constant ``MSKernel`` adds to the mean square (``src/operator/optimizer_op-inl.h``).
CADC_EPS = 1e-7


def local_learning_rate(options: Any, lr: float, world: int) -> float:
    """The local step's learning rate: ``--lr-local``, else ``lr`` (the paper's scripts),
    or ``world * lr`` with ``--local-lookahead on`` (W_loc then predicts the next W_g)."""
    if options.lr_local is not None:
        return float(options.lr_local)
    return lr * (world if options.local_lookahead == "on" else 1)


class ODSGD(Algorithm):
    """One-step-delay SGD: global weights lag one reduction, local weights compensate.

    LocalStep is the paper code's local optimizer (``--optimizer-local`` of its
    ``example/image-classification/common/fit.py``), an MXNet optimizer the worker
    registers as its kvstore updater (``python/mxnet/kvstore.py``,
    ``KVStore.set_optimizer``: ``self._set_updater(opt.get_updater(optimizer_local))``).
    ``src/kvstore/kvstore_dist.h``, ``KVStoreDist::Push_``, calls it once per
    step after the warm-up (``pull_first_time/parameter_count > 200``) as
    ``updater_(key, send_buf, &update_local)``: the worker's own gradient on
    ``comm_buf_copy``, which ``PullBroadImpl`` reset to the pulled ``W_g``
    (``CopyFromTo(comm_buf_[key], &comm_buf_copy[key])``) after broadcasting the
    previous result to the devices. The gradient is rescaled by
    ``rescale_grad = 1/(b*N)`` (``python/mxnet/module/module.py``,
    ``Module.init_optimizer``); our ``g`` is already the batch mean, hence ``g/N``.
    ``D`` below is the weight decay (``MomentumSGD.decay``: ``--weight-decay``, per
    element with ``--wd-exempt``, as MXNet's ``wd_mult`` exempts biases). The
    optimizer's state is created by ``Updater.__call__`` at its first call (the
    first delayed step) and kept across steps; no pull resets it.

    ``--local-opt sgd`` (MXNet ``SGD``, ``python/mxnet/optimizer.py``): with
    ``--local-momentum 0`` (default) ``sgd_update``,
    ``W_loc = W_g - lr_local * (g/N + D*W_g)``; with ``--local-momentum mu_l > 0``
    ``sgd_mom_update`` (``src/operator/optimizer_op-inl.h``, ``SGDMomKernel``:
    ``mom = momentum*mom - lr*wd*weight - lr*rescale_grad*grad``;
    ``weight + mom``)::

        mom = mu_l * mom - lr_local * (g/N + D*W_g)       # mom = 0 at the first delayed step
        W_loc = W_g + mom                                 # mom kept; W_g is the new pull

    The paper's ``fit.py`` defaults ``--mom-local`` to 0.1; its CIFAR scripts
    (``example/image-classification/cifar.sh``, ``example/gluon/run.sh``) pass 0.
    ``--local-momentum`` is only allowed with ``sgd``: MXNet's ``DCASGD`` takes a
    momentum and ignores it, ``CADCASGD`` passes it to ``adc_sgd_update``, which
    has no such parameter (dmlc rejects an unknown argument).

    ``--local-opt dc`` (the fork's ``DCASGD.update``, ``dc_sgd_update``)::

        W_loc = W_g - lr_local * (g/N + LAMBDA*(g/N)**2 * (W_g(t) - W_g(t-1)) + D*W_g)

    with ``W_g(t)`` the global weights this local step starts from and
    ``W_g(t-1)`` those the previous local step started from (its state
    ``previous_weight``, a copy of the weights at its first call: the
    compensation is zero at the first delayed step). ``--dc-lambda`` defaults to
    0.04, ``DCASGD``'s ``lamda``.

    ``--local-opt cadc`` (the fork's ``CADCASGD.update``: ``ms_update`` then
    ``adc_sgd_update``, kernels ``MSKernel`` and ``ADCKernel``; the local
    optimizer of ``cifar.sh`` and ``example/gluon/run.sh``)::

        MS = m*MS + (1 - m)*(g/N)**2 + 1e-7               # MS = 0 before the first delayed step
        W_loc = W_g - lr_local * (g/N + LAMBDA/sqrt(MS) * (g/N)**2 * (W_g(t) - W_g(t-1)) + D*W_g)

    ``--cadc-lambda`` (LAMBDA) defaults to 2 and ``--cadc-m`` (m) to 0.0, the
    defaults of ``CADCASGD.__init__`` (the scripts set neither); its state is
    ``MS`` (``self.MS[index]``, zeros at the first call) and ``previous_weight``
    (as ``dc``); the 1e-7 is ``MSKernel``'s. Momentum: none (see above).
    That is the kernel's formula with each parameter bound by its name
    (``--cadc-args named``, default). The fork's ``ADCUpdate`` launches
    ``ADCKernel`` with its scalars in another order than ``ADCKernel::Map``
    declares them (launch: ``clip_gradient, lr, wd, rescale_grad, lam``; Map:
    ``clip_gradient, lr, lam, wd, rescale_grad``), so the compiled code computes
    ``g/N + wd/sqrt(MS) * (g/N)**2 * dW_g + rescale_grad*W_g``
    (``dW_g = W_g(t) - W_g(t-1)``): LAMBDA is the
    weight decay and the decay is 1/(b*N) on every element; ``--cadc-args
    launched`` runs that (D as LAMBDA, ``1/(batch_size*N)`` as the decay).
    (``DCUpdate`` swaps ``lam`` and ``wd`` the same way; ``dc`` here keeps the
    named reading.)

    ``--lr-local`` defaults to ``--lr``; the paper's scripts tune it separately
    (0.1 with lr 0.1 on 4 workers, 0.5 with lr 0.1 on 8), so comparisons show
    OD-SGD at the best lr of a small grid.

    ``--warmup-steps`` (default 50): the paper's code warms up for 201 iterations
    (``count_pull > 199`` in ``python/mxnet/model.py``); ours is shorter because the
    runs here are short.

    ``--local-lookahead on`` replaces the local weight decay term by the part of
    the next global step that is already known,
    ``W_loc = W_g - lr_local * LocalOpt(g / N) - lr * (mu * v + D * W_g)``
    (``v``: GlobalOpt's velocity; with local momentum the buffer takes
    ``-lr_local * g/N`` only and ``W_loc = W_g + mom - lr * (mu * v + D * W_g)``),
    with ``--lr-local`` defaulting to N * lr, so W_loc is the next W_g with the own
    gradient standing in for the average (close to DANA, arXiv 1907.11612). Why it
    exists: W_g applies gradients one step stale. On a quadratic of curvature h
    whose gradient is the same on every rank (:mod:`syncbench.analysis.stability`),
    SSGD with heavy-ball momentum mu is stable for ``lr*h < 2*(1 + mu)`` (3.8 at
    mu = 0.9), the one-step-delayed global update without a local step for
    ``lr*h < 1 - mu`` (0.1), the paper's recurrence for ``lr*h < 0.105`` (N = 4,
    lr_local = lr; 0.125 with lr_local = N*lr; local momentum 0.1: 0.106), and the
    look-ahead with lr_local = N*lr for ``lr*h < 3.8``, SSGD's bound (the accuracies
    measured: docs/RESULTS.md, "OD-SGD's look-ahead"). The benchmark reports the
    paper's algorithm's instability rather than hiding it.
    """

    name = "odsgd"
    summary = "one-step-delay SGD (gradient Iallreduce overlaps the next step's compute)"
    hides_comm = True
    #: ``--local-lookahead on`` is not the published algorithm: labelled ``odsgd+la``.
    label_variants = (("local_lookahead", "on", "+la"),)
    simulation = "odsgd"

    @dataclass(frozen=True)
    class Options:
        """OD-SGD's options."""

        warmup_steps: int = option(
            50, "OD-SGD: plain SSGD steps before the one-step delay starts")
        lr_local: float | None = option(
            None, "OD-SGD: learning rate of the local compensation step (default --lr, as the "
            "paper; N*lr with --local-lookahead on, so W_loc predicts the next W_g)", type=float)
        local_opt: str = option(
            "sgd", "OD-SGD local optimizer on the rescaled gradient g/N, as the paper's code: "
            "sgd (MXNet SGD), dc (DCASGD: g/N + LAMBDA*(g/N)^2*(W_g(t) - W_g(t-1))) or cadc "
            "(CADCASGD: g/N + LAMBDA/sqrt(MS)*(g/N)^2*(W_g(t) - W_g(t-1)), "
            "MS = m*MS + (1-m)*(g/N)^2 + 1e-7) (default sgd)",
            choices=LOCAL_OPTS)
        dc_lambda: float = option(
            0.04, "OD-SGD: LAMBDA of --local-opt dc (default 0.04, as MXNet's DCASGD)")
        local_momentum: float = option(
            0.0, "OD-SGD: momentum of the local sgd optimizer, as MXNet's SGD: "
            "mom = mu_l*mom - lr_local*(g/N + wd*W_g), W_loc = W_g + mom, mom kept across "
            "steps; only with --local-opt sgd (default 0: plain SGD; the paper's fit.py "
            "sets 0.1, its CIFAR scripts 0)")
        cadc_lambda: float = option(
            2.0, "OD-SGD: LAMBDA of --local-opt cadc (default 2, as the paper's CADCASGD)")
        cadc_m: float = option(
            0.0, "OD-SGD: m of --local-opt cadc, the decay of its mean square "
            "MS = m*MS + (1-m)*(g/N)^2 + 1e-7 (default 0, as the paper's CADCASGD)")
        cadc_args: str = option(
            "named", "OD-SGD: named (default) runs the cadc kernel's formula with each "
            "parameter bound by its name; launched runs what the paper's compiled kernel "
            "computes (its launch swaps the scalars: LAMBDA := weight decay, weight decay := "
            "1/(batch_size*N))", choices=CADC_ARGS)
        local_lookahead: str = option(
            "off", "OD-SGD: off (default) is the paper's recurrence; on (our variant, labelled "
            "odsgd+la) subtracts from W_loc the known part of the next global step, "
            "lr*(momentum*v + weight_decay*W_g), instead of lr_local*weight_decay*W_g",
            choices=("off", "on"))

        def __post_init__(self) -> None:
            if self.warmup_steps < 0:
                raise ValueError(f"--warmup-steps must be >= 0, got {self.warmup_steps}")
            if self.lr_local is not None and self.lr_local <= 0:
                raise ValueError(f"--lr-local must be > 0, got {self.lr_local}")
            if self.dc_lambda < 0:
                raise ValueError(f"--dc-lambda must be >= 0, got {self.dc_lambda}")
            if not 0 <= self.local_momentum < 1:
                raise ValueError(f"--local-momentum must be in [0, 1), got {self.local_momentum}")
            if self.local_momentum and self.local_opt != "sgd":
                raise ValueError(f"--local-momentum needs --local-opt sgd, got {self.local_opt} "
                                 "(the paper's DCASGD ignores a momentum, CADCASGD rejects one)")
            if self.cadc_lambda < 0:
                raise ValueError(f"--cadc-lambda must be >= 0, got {self.cadc_lambda}")
            if not 0 <= self.cadc_m <= 1:
                raise ValueError(f"--cadc-m must be in [0, 1], got {self.cadc_m}")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        params = self.model.params
        self.warmup_steps: int = self.options.warmup_steps
        self.lookahead: bool = self.options.local_lookahead == "on"
        self.lr_local: float = local_learning_rate(self.options, self.config.lr, self.comm.size)
        self.local_opt: str = self.options.local_opt
        self.dc_lambda: float = self.options.dc_lambda
        self.local_momentum: float = self.options.local_momentum
        #: ``--cadc-args launched``: the compiled kernel's binding of its scalars.
        self.cadc_launched: bool = self.options.cadc_args == "launched"
        #: W_g, the global weights (identical on every rank).
        self.w_global = params.copy()
        self._recv = [params * 0, params * 0]  # two receive buffers: t and t-1 in flight
        self._scratch = params * 0
        self._scratch2: Any = None  # cadc's second temporary
        # The local optimizer's state, created at its first call (the first delayed step),
        # as MXNet's Updater creates it: W_g(t-1) of dc and cadc, cadc's mean square MS,
        # the local momentum buffer.
        self._w_g_prev: Any = None
        self._cadc_ms: Any = None
        self._local_mom: Any = None
        #: The reduction in flight: (request, its receive buffer), or None.
        self.pending: tuple[MPI.Request, Any] | None = None

    # -- one step --------------------------------------------------------------
    def _poll(self, offset: int | None = None) -> None:
        """Hook between layers: drive the outstanding Iallreduce (``Testall``)."""
        self.comm.poll()

    def step(self, x: Any, y: Any) -> StepStats:
        """One OD-SGD step on this rank's batch (SSGD during the warm-up)."""
        with self.timer.phase("compute"):
            loss = self.model.loss_and_grad(x, y, on_grads_ready=self._poll, poll=self._poll)
        self.straggle()
        delayed = self.steps_taken >= self.warmup_steps
        if delayed:
            self._delayed_update()
        else:
            self._warmup_update()
        self.steps_taken += 1
        return StepStats(loss=loss, samples=int(x.shape[0]), staleness=int(delayed))

    def _warmup_update(self) -> None:
        """SSGD: blocking allreduce, GlobalOpt on W_g, then W_loc = W_g."""
        grads = self.model.grads
        self.comm.Allreduce(grads)
        with self.timer.phase("update"):
            grads *= 1.0 / self.comm.size
            self.optimizer.step(self.w_global, grads)
            self.model.params[...] = self.w_global

    def _delayed_update(self) -> None:
        """Start this step's reduction, apply the previous one to W_g, compensate W_loc."""
        recv = self._recv[self.steps_taken % 2]
        with self.timer.phase("update"):
            recv[...] = self.model.grads
        request = self.comm.Iallreduce(recv)
        self._apply_pending()
        self.pending = (request, recv)
        with self.timer.phase("update"):
            self._local_update()

    def _apply_pending(self) -> None:
        """Wait for the reduction in flight (if any) and apply GlobalOpt to W_g."""
        if self.pending is None:
            return
        request, gsum = self.pending
        self.pending = None
        self.comm.Wait(request)
        with self.timer.phase("update"):
            gsum *= 1.0 / self.comm.size
            self.optimizer.step(self.w_global, gsum)

    def _local_update(self) -> None:
        """``W_loc = W_g - lr_local * (LocalOpt(g / N) + D * W_g)`` (``g`` in ``model.grads``).

        With ``--local-momentum`` the step goes through the momentum buffer,
        ``mom = mu_l * mom - lr_local * (g/N + D * W_g)``, ``W_loc = W_g + mom``
        (MXNet's ``SGDMomKernel``). With the look-ahead the weight decay term is
        replaced by ``lr * (mu * v + D * W_g)`` (:meth:`_subtract_known_global_step`).
        """
        params, grads, w_g = self.model.params, self.model.grads, self.w_global
        local = grads
        if self.local_opt == "dc":
            local = self._dc_gradient(grads, w_g)
        elif self.local_opt == "cadc":
            local = self._cadc_gradient(grads, w_g)
        if self.local_momentum:
            self._momentum_step(local)
            return
        params[...] = w_g
        params -= np.multiply(local, self.lr_local / self.comm.size, out=self._scratch)
        if self.lookahead:
            self._subtract_known_global_step(params)
        else:
            self._subtract_local_decay(params)

    def _momentum_step(self, local: Any) -> None:
        """``mom = mu_l*mom - lr_local*(local/N + D*W_g)``; ``W_loc = W_g + mom``.

        The paper code's local ``sgd`` with ``momentum > 0`` (MXNet ``SGD._update_impl``
        -> ``sgd_mom_update``): the buffer starts at zero at the first delayed
        step and is kept across steps, while the weights it updates are the
        freshly pulled W_g each step. With the look-ahead the buffer takes the
        gradient term only and the known global step is subtracted from W_loc.
        """
        if self._local_mom is None:
            self._local_mom = self.w_global * 0
        mom, params = self._local_mom, self.model.params
        mom *= self.local_momentum
        mom -= np.multiply(local, self.lr_local / self.comm.size, out=self._scratch)
        if not self.lookahead:
            self._subtract_local_decay(mom)
        params[...] = self.w_global
        params += mom
        if self.lookahead:
            self._subtract_known_global_step(params)

    def _squared_gradient_times_dw(self, grads: Any, w_g: Any) -> Any:
        """``g^2 * (W_g(t) - W_g(t-1))`` in ``_scratch``, then W_g(t-1) := W_g(t) (the
        ``previous_weight`` of DCASGD and CADCASGD: a copy at their first call, so 0 there)."""
        if self._w_g_prev is None:
            self._w_g_prev = w_g.copy()
        local = np.subtract(w_g, self._w_g_prev, out=self._scratch)
        self._w_g_prev[...] = w_g
        local *= grads
        local *= grads
        return local

    def _dc_gradient(self, grads: Any, w_g: Any) -> Any:
        """``g + N * LAMBDA * (g/N)^2 * (W_g(t) - W_g(t-1))`` in ``_scratch`` (then times 1/N)."""
        local = self._squared_gradient_times_dw(grads, w_g)
        # lambda * (g/N)^2 * dW_g, then (g + that * N) / N below: the paper code's
        # compensation of the rescaled gradient g/N, not N times it.
        local *= self.dc_lambda / self.comm.size
        local += grads
        return local

    def _cadc_gradient(self, grads: Any, w_g: Any) -> Any:
        """CADCASGD: ``g + N * LAMBDA/sqrt(MS) * (g/N)^2 * dW_g`` in ``_scratch`` (then times 1/N).

        ``MS = m*MS + (1 - m)*(g/N)^2 + 1e-7`` first (``ms_update``), then
        ``adc_sgd_update``'s compensation with the new MS. ``--cadc-args
        launched``: LAMBDA is the per-element weight decay (``decay_of``).
        """
        size = self.comm.size
        if self._cadc_ms is None:  # CADCASGD's state at its first call
            self._cadc_ms = w_g * 0
        if self._scratch2 is None:
            self._scratch2 = w_g * 0
        ms, tmp, m = self._cadc_ms, self._scratch2, self.options.cadc_m
        ms *= m
        np.multiply(grads, grads, out=tmp)
        tmp *= (1.0 - m) / (size * size)
        ms += tmp
        ms += CADC_EPS
        local = self._squared_gradient_times_dw(grads, w_g)
        local /= np.sqrt(ms, out=tmp)
        if self.cadc_launched:
            local = self.optimizer.decay_of(local, out=local)
            local *= 1.0 / size
        else:
            local *= self.options.cadc_lambda / size
        local += grads
        return local

    def _subtract_local_decay(self, target: Any) -> None:
        """``target -= lr_local * D * W_g`` (``--cadc-args launched``: D = 1/(batch_size*N))."""
        if self.local_opt == "cadc" and self.cadc_launched:
            rescale = 1.0 / (self.budget.batch_size * self.comm.size)
            target -= np.multiply(self.w_global, self.lr_local * rescale, out=self._scratch)
        elif self.optimizer.weight_decay:
            decay = self.optimizer.decay_of(self.w_global, out=self._scratch)
            decay *= self.lr_local
            target -= decay

    def _subtract_known_global_step(self, params: Any) -> None:
        """``W_loc -= lr * (mu * v + wd * W_g)``: the part of the next global step known now."""
        opt = self.optimizer
        params -= np.multiply(opt.velocity, opt.lr * opt.momentum, out=self._scratch)
        if opt.weight_decay:
            decay = opt.decay_of(self.w_global, out=self._scratch)
            decay *= opt.lr
            params -= decay

    # -- checkpoints -----------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Resumable state: W_loc, velocity, steps, W_g, the unapplied gradient sum, and
        the local optimizer's state (W_g(t-1) of dc/cadc, cadc's MS, the local momentum).

        The reduction in flight is completed first (every rank calls this at the
        same evaluation point); its sum is applied at the next step as usual.
        """
        to_numpy = self.model.backend.to_numpy
        state = super().state()
        empty = np.zeros(0, dtype=self.w_global.dtype)
        if self.pending is not None:
            self.comm.Wait(self.pending[0])
        state["w_global"] = to_numpy(self.w_global).copy()
        state["gsum_pending"] = empty if self.pending is None else to_numpy(self.pending[1]).copy()
        for key, buf in (("w_g_prev", self._w_g_prev), ("cadc_ms", self._cadc_ms),
                         ("local_mom", self._local_mom)):
            state[key] = empty if buf is None else to_numpy(buf).copy()
        return state

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` saved (on the same rank)."""
        asarray = self.model.backend.asarray
        super().load_state(state)
        self.w_global[...] = asarray(state["w_global"])
        self.pending = None
        if np.size(state["gsum_pending"]):
            buf = self._recv[(self.steps_taken - 1) % 2]
            buf[...] = asarray(state["gsum_pending"])
            self.pending = (MPI.REQUEST_NULL, buf)  # already complete: Wait returns at once

        def restored(key: str) -> Any:
            saved = state.get(key)  # absent from checkpoints of older versions
            return asarray(saved).copy() if saved is not None and np.size(saved) else None

        self._w_g_prev = restored("w_g_prev")
        self._cadc_ms = restored("cadc_ms")
        self._local_mom = restored("local_mom")

    # -- end of training -------------------------------------------------------
    def consensus_params(self) -> Any:
        """W_g: identical on every rank (not collective)."""
        return self.w_global

    def finish(self) -> None:
        """Drain the last reduction into W_g; afterwards W_loc = W_g too."""
        if self.pending is not None:
            self._apply_pending()
            self.model.params[...] = self.w_global

    def close(self) -> None:
        """Drop a reduction still in flight (error paths: the job is being aborted)."""
        if self.pending is not None:
            request = self.pending[0]
            self.comm.outstanding = [r for r in self.comm.outstanding if r is not request]
            self.pending = None
