"""Deep Gradient Compression's momentum correction and warm-up for the sparsifiers
(Lin, Han, Mao, Wang, Dally, "Deep Gradient Compression", ICLR 2018, arXiv 1712.01887,
section 3 and Algorithm 1; the authors' code, ``dgc/memory.py`` ``DGCSGDMemory`` and
``dgc/compression.py`` ``DGCCompressor.warmup_compress_ratio``).

Options of ``topk:D`` and ``randomk:D``, written after the density:
``topk:0.01,momentum=0.9,warmup=400``.

- ``momentum=M`` (momentum correction with momentum factor masking): every rank keeps a
  velocity ``u`` beside its residual ``v``; each step ``u = M u + g``, ``v = v + u``,
  the sparsifier sends entries of ``v``, and ``u`` and ``v`` are zeroed where it sent.
  Momentum then lives before the sparsification, so the update after the reduction
  must apply none (:class:`MomentumCorrection`; SSGD steps with momentum 0). Without
  it, error feedback feeds the residual of raw gradients to a momentum applied after
  the reduction, and the momentum of a coordinate sent once in many steps is wrong.
  Masking restarts a coordinate's momentum each time it is sent, as Algorithm 1 does:
  at ``D`` 1 every coordinate is sent every step and this is SGD without momentum.
  ``M`` 0 (the default) is plain error feedback.
- ``warmup=S`` (warm-up): over the first ``S`` steps the density falls exponentially
  to ``D`` in :data:`WARMUP_STAGES` stages, stage ``s`` (steps ``[s S / 4, (s + 1) S / 4)``)
  at ``D ** ((s + 1) / 5)``, the authors' ``warmup_coeff ** (epoch + 1)`` with
  ``warmup_coeff = D ** (1 / (W + 1))``. The paper's 25%, 6.25%, 1.5625%, 0.4%, then
  0.1% over four epochs is this schedule for ``D = 0.001`` (0.251, 0.0631, 0.0158,
  0.00398). The paper counts the stages in epochs; here they are steps, as the
  other warm-ups of this package (``--powersgd-start``, ``--warmup-steps``), since a
  strategy does not know the epoch's length. ``S`` 0 (the default): no warm-up.

Not implemented: DGC's local gradient clipping, its sampled threshold selection (top-k
here is exact) and Nesterov momentum.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

#: Stages of the warm-up (the paper's four warm-up epochs).
WARMUP_STAGES = 4


@dataclass(frozen=True)
class DGCOptions:
    """``momentum=M`` and ``warmup=S`` of a sparsifier's spec (defaults: both off)."""

    momentum: float = 0.0
    warmup: int = 0

    def __post_init__(self) -> None:
        m = self.momentum
        if isinstance(m, bool) or not isinstance(m, (int, float, np.floating)) \
                or not 0.0 <= float(m) < 1.0:  # NaN fails this too
            raise ValueError(f"momentum={m} is outside [0, 1): give a momentum factor "
                             "0 <= M < 1 (e.g. momentum=0.9)")
        w = self.warmup
        if isinstance(w, bool) or not isinstance(w, (int, np.integer)) or w < 0:
            raise ValueError(f"warmup={w} is not a step count >= 0 (e.g. warmup=400)")
        object.__setattr__(self, "momentum", float(m))
        object.__setattr__(self, "warmup", int(w))

    @property
    def corrects_momentum(self) -> bool:
        """Whether the sparsifier applies the momentum (the update must apply none)."""
        return self.momentum > 0.0

    def spec_suffix(self) -> str:
        """The options as the spec writes them after the density ('' when both are off)."""
        parts = []
        if self.momentum:
            parts.append(f"momentum={self.momentum!r}")
        if self.warmup:
            parts.append(f"warmup={self.warmup}")
        return "".join(f",{p}" for p in parts)


def warmup_density(density: float, warmup: int, step: int) -> float:
    """The density of ``step`` (from 0): ``density ** ((s + 1) / 5)`` in warm-up stage
    ``s = floor(4 step / warmup)`` while ``step < warmup``, then ``density``."""
    if step < 0:
        raise ValueError(f"warm-up step {step} is negative")
    if step >= warmup:
        return density
    stage = step * WARMUP_STAGES // warmup
    return max(density ** ((stage + 1) / (WARMUP_STAGES + 1)), density)


def parse_options(name: str, items: list[str]) -> DGCOptions:
    """The ``KEY=VALUE`` items after a sparsifier's density; a one-line ValueError for an
    unknown, repeated or bad one."""
    example = f"(e.g. {name}:0.01,momentum=0.9,warmup=400)"
    values: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if key not in ("momentum", "warmup") or not sep:
            raise ValueError(f"{name} option '{item}' is not momentum=M or warmup=STEPS "
                             f"{example}")
        if key in values:
            raise ValueError(f"{name} option {key} is given twice {example}")
        values[key] = value
    momentum = _value(name, values, "momentum", float, 0.0,
                      "is not a number: give 0 <= M < 1 (e.g. momentum=0.9)")
    warmup = _value(name, values, "warmup", int, 0,
                    "is not an integer: give a step count >= 0 (e.g. warmup=400)")
    try:
        return DGCOptions(momentum, warmup)
    except ValueError as err:
        raise ValueError(f"{name} {err}") from None


def _value(name: str, values: dict[str, str], key: str, cast: type, default: Any,
           problem: str) -> Any:
    """``values[key]`` as ``cast`` (``default`` when absent); one line naming it if not."""
    if key not in values:
        return default
    try:
        return cast(values[key])
    except ValueError:
        raise ValueError(f"{name} {key} '{values[key]}' {problem}") from None


class MomentumCorrection:
    """One rank's DGC memory of a vector of ``size`` elements: velocity and residual
    (float32, as the gradient), with momentum factor masking."""

    def __init__(self, size: int, momentum: float) -> None:
        self.momentum = np.float32(momentum)
        #: ``u``: the local momentum of the gradients.
        self.velocity = np.zeros(int(size), dtype=np.float32)
        #: ``v``: the accumulated velocity not yet sent.
        self.residual = np.zeros(int(size), dtype=np.float32)

    def accumulate(self, grad: np.ndarray) -> np.ndarray:
        """``u = M u + g``, ``v = v + u``; returns ``v`` (this memory's own array: the
        sparsifier reads it, :meth:`mask` then zeroes what was sent)."""
        if grad.shape != self.velocity.shape:
            raise ValueError(f"gradient of shape {grad.shape}, memory of {self.velocity.shape}")
        self.velocity *= self.momentum
        self.velocity += grad
        self.residual += self.velocity
        return self.residual

    def mask(self, indices: np.ndarray) -> None:
        """Zero ``u`` and ``v`` at the sent ``indices`` (momentum factor masking)."""
        self.velocity[indices] = 0
        self.residual[indices] = 0
