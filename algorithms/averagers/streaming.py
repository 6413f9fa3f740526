"""Streaming DiLoCo: the model synchronized in fragments at staggered steps, each
fragment's reduction overlapped with ``tau`` inner steps and merged by ``alpha``.

Douillard et al., "Streaming DiLoCo with overlapping communication" (2025, arXiv
2501.18512), Alg. 2, on torchft's schedule (``torchft/local_sgd.py``, ``DiLoCo`` and
``_StreamingDiLoCoFragment``): the parameters are cut into P fragments of whole layers
(:func:`fragment_bounds`); counting inner steps s = 1, 2, ... from the start of the
rounds, fragment p (offset ``o_p = floor(H / P * (p + 1))``, the last one H):

- at s = o_p + kH, posts an ``Iallreduce`` of its pseudo-gradient
  ``theta_i - theta_global`` (progressed by the communicator's polls between layers);
- at s = o_p + kH + tau (``tau`` < H // P, so one fragment is in flight at a time)
  completes it, steps its own outer optimizer on its anchor slice, and merges:
  ``theta_i <- alpha theta_i + (1 - alpha) theta_global`` (``alpha`` 0: the global
  fragment, as torchft; the pseudo-gradients of the tau overlapped steps are kept
  locally only in proportion to alpha).

The global model (every fragment's anchor) is identical on every rank at every step;
it is the model evaluated, at any step with no reduction in flight. At the budget's
end every fragment completes what is in flight and, if it took inner steps since its
last post, one last blocking sync; then every replica is the global model (and
BatchNorm's statistics are averaged), so the final model is a consensus.
With P 1, tau 0 and alpha 0 this is DiLoCo's
:class:`~syncbench.algorithms.averagers.pseudo_gradient.PseudoGradientAverager`.

With a ``quantized`` reduction (``--quantize``, the paper's section 2.3,
:mod:`~syncbench.algorithms.averagers.quantized`) a fragment's post starts a
reduce-scatter of its codes instead of the ``Iallreduce``; :meth:`poll` (called between
layers while a fragment is in flight) posts the allgather of the mean's codes once the
first collective completed, and the completion steps the outer optimizer on the float32
mean.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from syncbench.algorithms.averagers import ModelAverager, average_over_ranks
from syncbench.algorithms.averagers.quantized import NONE, QuantizedReduction
from syncbench.algorithms.outer import OuterOptimizer


def fragment_bounds(layer_offsets: Sequence[int], size: int,
                    fragments: int) -> list[tuple[int, int]]:
    """``[start, end)`` of ``fragments`` contiguous fragments of whole layers with
    parameters, as equal in layer count as can be (earlier fragments one layer more);
    they tile ``[0, size)``. ``ValueError`` if the model has fewer such layers."""
    bounds = [*layer_offsets[1:], size]
    layers = [(lo, hi) for lo, hi in zip(layer_offsets, bounds) if hi > lo]
    if fragments > len(layers):
        raise ValueError(f"--fragments {fragments}: the model has only {len(layers)} layers "
                         "with parameters")
    groups = np.array_split(np.arange(len(layers)), fragments)
    cuts = [layers[g[0]][0] for g in groups] + [size]
    cuts[0] = 0
    return list(zip(cuts[:-1], cuts[1:]))


def fragment_offsets(period: int, fragments: int) -> list[int]:
    """torchft's ``fragment_sync_offset`` of each fragment: ``floor(H / P * (p + 1))``."""
    return [int(period / fragments * (p + 1)) for p in range(fragments)]


class StreamingAverager(ModelAverager):
    """P fragments, each with its own anchor slice, outer optimizer and schedule."""

    def __init__(self, core: Any, period: int, fragments: int, overlap_steps: int,
                 mix: float, make_outer: Callable[[Any], OuterOptimizer],
                 quantize: str = "none") -> None:
        super().__init__(core)
        model = core.model
        self.period, self.overlap_steps, self.mix = int(period), int(overlap_steps), float(mix)
        self.bounds = fragment_bounds(model.layer_offsets, model.size, fragments)
        self.offsets = fragment_offsets(self.period, fragments)
        #: theta_global: every fragment's anchor (identical on every rank).
        self.anchor = model.params.copy()
        self._delta = model.params * 0
        self.outers = [make_outer(self.anchor[lo:hi]) for lo, hi in self.bounds]
        self.pending: list[Any] = [None] * fragments
        #: Inner steps since the rounds began, and each fragment's last post.
        self.local_step = 0
        self.posted_at = [0] * fragments
        self.started = False
        #: The codec the fragments travel in (``--quantize``), else None (Iallreduce).
        self.quantized = (QuantizedReduction(core, quantize, self.bounds)
                          if quantize != NONE else None)

    def wire_bytes(self) -> list[int]:
        """Bytes of each fragment's pseudo-gradient this rank hands to MPI per sync: its
        codes, else its float32 (the model's dtype) ``Iallreduce`` buffer."""
        if self.quantized is not None:
            return [self.quantized.wire_bytes(p) for p in range(len(self.bounds))]
        return [int(self._delta[lo:hi].nbytes) for lo, hi in self.bounds]

    def poll(self) -> None:
        """Progress the fragment in flight (between layers): MPI's, and a quantized
        reduction's next collective once its first completed."""
        self.core.comm.poll()
        if self.quantized is not None:
            self.quantized.poll()

    # -- the schedule ------------------------------------------------------------------
    def begin(self) -> None:
        """Rounds start now, from the current (common) parameters."""
        self.anchor[...] = self.core.model.params
        self.local_step, self.started = 0, True
        self.posted_at = [0] * len(self.bounds)

    def after_step(self, last: bool) -> None:
        """Count one inner step; post and complete what falls due (torchft's order: posts,
        then completions); at the budget's end (``last``), the final sync."""
        self.local_step += 1
        s = self.local_step
        for p, offset in enumerate(self.offsets):
            if s >= offset and (s - offset) % self.period == 0:
                self.post(p)
        for p, offset in enumerate(self.offsets):
            if (self.pending[p] is not None
                    and (s - offset - self.overlap_steps) % self.period == 0):
                self.complete(p)
        if last:
            self.final_sync()

    def in_flight(self) -> bool:
        return any(r is not None for r in self.pending)

    @property
    def round(self) -> int:
        return self.local_step // self.period

    # -- one fragment ------------------------------------------------------------------
    def post(self, p: int) -> None:
        """Fragment p's pseudo-gradient ``theta_i - anchor`` into its slice; Iallreduce."""
        core = self.core
        lo, hi = self.bounds[p]
        with core.timer.phase("update"):
            delta = self._delta[lo:hi]
            delta[...] = core.model.params[lo:hi]
            delta -= self.anchor[lo:hi]
        if self.quantized is None:
            self.pending[p] = core.comm.Iallreduce(delta)
        else:
            self.quantized.post(p, delta)
            self.pending[p] = p  # what is in flight is the quantized reduction's
        self.posted_at[p] = self.local_step

    def complete(self, p: int, mix: float | None = None) -> None:
        """Wait for fragment p, step its outer optimizer, merge by alpha."""
        core = self.core
        lo, hi = self.bounds[p]
        summed, count = self._delta[lo:hi], core.comm.size
        if self.quantized is None:
            core.comm.Wait(self.pending[p])
        else:  # the mean of the ranks' fragments, as one rank's sum
            mean = self.quantized.wait(p)
            with core.timer.phase("codec"):
                summed[...] = core.model.backend.asarray(mean)
            count = 1
        self.pending[p] = None
        alpha = self.mix if mix is None else mix
        with core.timer.phase("update"):
            anchor, params = self.anchor[lo:hi], core.model.params[lo:hi]
            self.outers[p].step(anchor, summed, count)
            if alpha:
                params *= alpha
                params += (1 - alpha) * anchor
            else:
                params[...] = anchor

    def final_sync(self) -> None:
        """The budget's end: complete in-flight fragments, then one blocking sync of every
        fragment with inner steps since its last post; every replica <- the global model."""
        for p in range(len(self.bounds)):
            if self.pending[p] is not None:
                self.complete(p)
            if self.local_step > self.posted_at[p]:
                self.post(p)
                self.complete(p, mix=0.0)
        model = self.core.model
        model.params[...] = self.anchor
        if model.buffers.size:
            average_over_ranks(self.core, model.buffers)

    def average(self) -> None:
        """Complete every fragment in flight (collective)."""
        for p in range(len(self.bounds)):
            if self.pending[p] is not None:
                self.complete(p)

    # -- checkpoints (no reduction in flight) --------------------------------------------
    def state(self) -> dict[str, Any]:
        to_numpy = self.core.model.backend.to_numpy
        out: dict[str, Any] = {"anchor": to_numpy(self.anchor).copy(),
                               "local_step": self.local_step,
                               "posted_at": np.asarray(self.posted_at, np.int64)}
        for p, outer in enumerate(self.outers):
            for key, value in outer.state().items():
                out[f"fragment{p}_{key}"] = (to_numpy(value).copy() if hasattr(value, "shape")
                                             else value)
        return out

    def load_state(self, state: dict[str, Any], rounds_started: bool) -> None:
        asarray = self.core.model.backend.asarray
        if not rounds_started:
            return
        self.anchor[...] = asarray(state["anchor"])
        self.local_step, self.started = int(state["local_step"]), True
        self.posted_at = [int(v) for v in np.asarray(state["posted_at"])]
        for p, outer in enumerate(self.outers):
            prefix = f"fragment{p}_"
            outer.load_state({key[len(prefix):]: (asarray(value) if hasattr(value, "shape")
                                                  else value)
                              for key, value in state.items() if key.startswith(prefix)})
