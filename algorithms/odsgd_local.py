"""OD-SGD's local optimizer: the compensation step that makes W_loc from W_g.

LocalStep of OD-SGD (Xu et al. 2020, arXiv 2005.06728; ALGORITHMS.md, "OD-SGD") as the
paper's public MXNet code runs it: the worker's own rescaled gradient g/N applied to the
pulled global weights by ``--local-opt`` (MXNet's ``SGD``, the fork's ``DCASGD`` or
``CADCASGD``), optionally with the look-ahead variant. The formulas and the sources
they follow are :class:`~syncbench.algorithms.odsgd.ODSGD`'s docstring. A local
optimizer part: the strategy hands it (W_loc, g, W_g) after each delayed step; its
state (W_g(t-1), cadc's mean square, the local momentum) is created at its first call,
as MXNet's ``Updater`` creates it, and checkpointed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: The constant ``MSKernel`` adds to the mean square (``src/operator/optimizer_op-inl.h``).
CADC_EPS = 1e-7


class CompensationStep:
    """``W_loc = W_g - lr_local * (LocalOpt(g / N) + D * W_g)`` (or its variants).

    ``global_opt`` is the strategy's global optimizer (its decay ``D``, velocity, lr and
    momentum: the look-ahead subtracts its known part of the next global step).
    """

    def __init__(self, options: Any, lr_local: float, world: int, batch_size: int,
                 global_opt: Any, like: Any) -> None:
        self.options = options
        self.lr_local = lr_local
        self.world = world
        self.batch_size = batch_size
        self.global_opt = global_opt
        self.lookahead: bool = options.local_lookahead == "on"
        #: ``--cadc-args launched``: the compiled kernel's binding of its scalars.
        self.cadc_launched: bool = options.cadc_args == "launched"
        self._scratch = like * 0
        self._scratch2: Any = None  # cadc's second temporary
        # The state, created at the first call (the first delayed step), as MXNet's
        # Updater creates it: W_g(t-1) of dc and cadc, cadc's mean square MS, the local
        # momentum buffer.
        self._w_g_prev: Any = None
        self._cadc_ms: Any = None
        self._local_mom: Any = None
        self._w_g: Any = None
        self._params: Any = None

    def apply(self, params: Any, grads: Any, w_g: Any) -> None:
        """``W_loc = W_g - lr_local * (LocalOpt(g / N) + D * W_g)`` (``g`` this rank's gradient).

        With ``--local-momentum`` the step goes through the momentum buffer,
        ``mom = mu_l * mom - lr_local * (g/N + D * W_g)``, ``W_loc = W_g + mom``
        (MXNet's ``SGDMomKernel``). With the look-ahead the weight decay term is
        replaced by ``lr * (mu * v + D * W_g)`` (:meth:`_subtract_known_global_step`).
        """
        self._w_g, self._params = w_g, params
        local = grads
        if self.options.local_opt == "dc":
            local = self._dc_gradient(grads, w_g)
        elif self.options.local_opt == "cadc":
            local = self._cadc_gradient(grads, w_g)
        if self.options.local_momentum:
            self._momentum_step(local)
            return
        params[...] = w_g
        params -= np.multiply(local, self.lr_local / self.world, out=self._scratch)
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
            self._local_mom = self._w_g * 0
        mom, params = self._local_mom, self._params
        mom *= self.options.local_momentum
        mom -= np.multiply(local, self.lr_local / self.world, out=self._scratch)
        if not self.lookahead:
            self._subtract_local_decay(mom)
        params[...] = self._w_g
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
        local *= self.options.dc_lambda / self.world
        local += grads
        return local

    def _cadc_gradient(self, grads: Any, w_g: Any) -> Any:
        """CADCASGD: ``g + N * LAMBDA/sqrt(MS) * (g/N)^2 * dW_g`` in ``_scratch`` (then times 1/N).

        ``MS = m*MS + (1 - m)*(g/N)^2 + 1e-7`` first (``ms_update``), then
        ``adc_sgd_update``'s compensation with the new MS. ``--cadc-args
        launched``: LAMBDA is the per-element weight decay (``decay_of``).
        """
        size = self.world
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
            local = self.global_opt.decay_of(local, out=local)
            local *= 1.0 / size
        else:
            local *= self.options.cadc_lambda / size
        local += grads
        return local

    def _subtract_local_decay(self, target: Any) -> None:
        """``target -= lr_local * D * W_g`` (``--cadc-args launched``: D = 1/(batch_size*N))."""
        if self.options.local_opt == "cadc" and self.cadc_launched:
            rescale = 1.0 / (self.batch_size * self.world)
            target -= np.multiply(self._w_g, self.lr_local * rescale, out=self._scratch)
        elif self.global_opt.weight_decay:
            decay = self.global_opt.decay_of(self._w_g, out=self._scratch)
            decay *= self.lr_local
            target -= decay

    def _subtract_known_global_step(self, params: Any) -> None:
        """``W_loc -= lr * (mu * v + wd * W_g)``: the part of the next global step known now,
        at the rate that step will take (``--lr`` under ``--lr-schedule``)."""
        opt = self.global_opt
        lr = opt.clock.peek_lr()
        params -= np.multiply(opt.velocity, lr * opt.momentum, out=self._scratch)
        if opt.weight_decay:
            decay = opt.decay_of(self._w_g, out=self._scratch)
            decay *= lr
            params -= decay

    # -- checkpoints -----------------------------------------------------------
    def state(self, to_numpy: Any, dtype: Any) -> dict[str, Any]:
        """W_g(t-1) of dc/cadc, cadc's MS, the local momentum (empty where not made yet)."""
        empty = np.zeros(0, dtype=dtype)
        return {key: empty if buf is None else to_numpy(buf).copy()
                for key, buf in (("w_g_prev", self._w_g_prev), ("cadc_ms", self._cadc_ms),
                                 ("local_mom", self._local_mom))}

    def load_state(self, state: dict[str, Any], asarray: Any) -> None:
        def restored(key: str) -> Any:
            saved = state.get(key)  # absent from checkpoints of older versions
            return asarray(saved).copy() if saved is not None and np.size(saved) else None

        self._w_g_prev = restored("w_g_prev")
        self._cadc_ms = restored("cadc_ms")
        self._local_mom = restored("local_mom")
