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
``warmup_steps``). ``--local-lookahead`` is our variant, not the paper's
(labelled ``odsgd+la``): W_loc predicts the next W_g, which restores SSGD's
stability where the paper's recurrence needs a far smaller step (:class:`ODSGD`).

A composition of parts: the warm-up's reducer
(:class:`~syncbench.algorithms.reducers.allreduce.BlockingAllreduce`), the delayed one
(:class:`~syncbench.algorithms.reducers.delayed.DelayedAllreduce`: step t's
``Iallreduce`` polled through step t+1's forward and backward), GlobalOpt (the
strategy's momentum SGD on W_g) and LocalStep
(:class:`~syncbench.algorithms.odsgd_local.CompensationStep`). Every step is a
lock-step point, and the consensus model is W_g (one gradient behind until
:meth:`ODSGD.finish`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from syncbench.algorithms.base import StepStats, Strategy
from syncbench.algorithms.flags import StrategyOptions, option
from syncbench.algorithms.odsgd_local import CompensationStep
from syncbench.algorithms.reducers.allreduce import BlockingAllreduce
from syncbench.algorithms.reducers.delayed import DelayedAllreduce
from syncbench.algorithms.traits import StrategyTraits

LOCAL_OPTS = ("sgd", "dc", "cadc")
#: ``--cadc-args``: the kernel's parameters bound by name, or as the fork launches them.
CADC_ARGS = ("named", "launched")


def local_learning_rate(options: Any, lr: float, world: int) -> float:
    """The local step's learning rate: ``--lr-local``, else ``lr`` (the paper's scripts),
    or ``world * lr`` with ``--local-lookahead`` (W_loc then predicts the next W_g)."""
    if options.lr_local is not None:
        return float(options.lr_local)
    return lr * (world if options.local_lookahead == "on" else 1)


class ODSGD(Strategy):
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

    ``--local-lookahead`` replaces the local weight decay term by the part of
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
    #: ``--local-lookahead`` is not the published algorithm: labelled ``odsgd+la``.
    traits = StrategyTraits(hides_comm=True, label_variants=(("local_lookahead", "on", "+la"),),
                            simulation="odsgd", local_optimizers=("sgd",))

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        """OD-SGD's options."""

        warmup_steps: int = option(
            50, "OD-SGD: plain SSGD steps before the one-step delay starts")
        lr_local: float | None = option(
            None, "OD-SGD: learning rate of the local compensation step (default --lr, as the "
            "paper; N*lr with --local-lookahead, so W_loc predicts the next W_g)", type=float)
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
        params, size = self.model.params, self.comm.size
        self.warmup_steps: int = self.options.warmup_steps
        self.run_attributes["warmup_steps"] = self.warmup_steps
        self.lr_local: float = local_learning_rate(self.options, self.config.lr, size)
        #: W_g, the global weights (identical on every rank).
        self.w_global = params.copy()
        self.warmup_reducer = BlockingAllreduce(self)
        self.reducer = DelayedAllreduce(self)
        self.run_attributes["wire_bytes_per_step"] = self.reducer.wire_bytes()
        self.local_step = CompensationStep(self.options, self.lr_local, size,
                                           self.budget.batch_size, self.optimizer, params)

    @property
    def pending(self) -> Any:
        """The reduction in flight, else None."""
        return self.reducer.pending

    def step(self, x: Any, y: Any) -> StepStats:
        """One OD-SGD step on this rank's batch (SSGD during the warm-up)."""
        loss = self.compute_gradient(x, y, self.reducer.hooks())
        delayed = self.steps_taken >= self.warmup_steps
        if delayed:  # GlobalOpt on the previous step's mean, then LocalStep
            previous = self.reducer.complete()
            if previous is not None:
                with self.timer.phase("update"):
                    self.optimizer.step(self.w_global, previous)
            with self.timer.phase("update"):
                self.local_step.apply(self.model.params, self.model.grads, self.w_global)
        else:  # SSGD: GlobalOpt on this step's mean, then W_loc = W_g
            grads = self.warmup_reducer.complete()
            with self.timer.phase("update"):
                self.optimizer.step(self.w_global, grads)
                self.model.params[...] = self.w_global
        self.steps_taken += 1
        return StepStats(loss=loss, samples=int(x.shape[0]), staleness=int(delayed))

    # -- checkpoints -----------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """Resumable state: W_loc, velocity, steps, W_g, the unapplied gradient sum (the
        reduction in flight, completed first: every rank calls this at the same point;
        the next step applies it as usual) and LocalStep's state."""
        backend = self.model.backend
        return {**super().state(), "w_global": backend.to_numpy(self.w_global).copy(),
                **self.reducer.state(),
                **self.local_step.state(backend.to_numpy, self.w_global.dtype)}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` saved (on the same rank)."""
        super().load_state(state)
        self.w_global[...] = self.model.backend.asarray(state["w_global"])
        self.reducer.load_state(state)
        self.local_step.load_state(state, self.model.backend.asarray)

    # -- end of training -------------------------------------------------------
    def consensus_params(self) -> Any:
        """W_g: identical on every rank (not collective)."""
        return self.w_global

    def finish(self) -> None:
        """Drain the last reduction into W_g; afterwards W_loc = W_g too."""
        last = self.reducer.drain()
        if last is not None:
            with self.timer.phase("update"):
                self.optimizer.step(self.w_global, last)
            self.model.params[...] = self.w_global

    def close(self) -> None:
        """Drop a reduction still in flight (error paths: the job is being aborted)."""
        self.reducer.close()
