"""Stability of SSGD and OD-SGD on a quadratic: the largest stable ``lr * h``.

On ``f(w) = h/2 * w**2`` with every worker's gradient equal (``h * W_loc``;
no data noise, weight decay 0), one step of each recurrence is a linear map
of its state, ``s_{t+1} = A(x) s_t`` with ``x = lr * h``; the iterates decay
from any start iff the spectral radius of the companion matrix ``A(x)`` is
below 1. :func:`stability_bounds` returns, for each recurrence, the largest
``x*`` such that every ``x`` in ``(0, x*)`` is stable.

SSGD, heavy-ball momentum ``mu`` (``kernels/ops.py``, ``sgd_momentum_``:
``v = mu*v + g``, ``w -= lr*v``), state ``(w, u = lr*v)``::

    u' = mu*u + x*w
    w' = w - u'                      bound: x < 2*(1 + mu)

OD-SGD as :mod:`syncbench.algorithms.odsgd` runs it after the warm-up: at
step t the rank computes ``g_t = h*W_loc(t)``, applies the previous step's
averaged gradient to ``W_g`` by momentum SGD, then sets
``W_loc(t+1) = W_g - lr_local * g_t / N`` (plus its options). State
``(W_g, u = lr*v, p = W_loc(t-1), q = W_loc(t), m = local momentum buffer)``,
with ``r = lr_local / lr`` and ``c = r * x / N``::

    u' = mu*u + x*p                  # GlobalOpt with g_{t-1} = h*p
    W_g' = W_g - u'
    p' = q
    m' = mu_l*m - c*q                # --local-momentum mu_l (0: m stays 0)
    q' = W_g' + m' - la*mu*u'        # la = 1 with --local-lookahead

(with ``mu_l = 0``, ``q' = W_g' - c*q``: the paper's recurrence). The
compensations of ``--local-opt dc``/``cadc`` add terms of second order in
``(w, dW_g)`` (``(g/N)**2 * dW_g``; cadc's ``(g/N)**2/sqrt(MS)`` is
``|g/N| * dW_g`` for m = 0), so their linearisation at the minimum is the
``sgd`` map: the bounds here are theirs for small perturbations too.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np


def ssgd_matrix(x: float, momentum: float) -> np.ndarray:
    """SSGD with heavy-ball momentum: the map of ``(w, lr*v)`` at ``x = lr*h``."""
    return np.array([[1.0 - x, -momentum],
                     [x, momentum]])


def odsgd_matrix(x: float, momentum: float, lr_ratio: float = 1.0, n: int = 4,
                 lookahead: bool = False, local_momentum: float = 0.0) -> np.ndarray:
    """OD-SGD after the warm-up: the map of ``(W_g, lr*v, W_loc(t-1), W_loc(t), mom)``.

    ``lr_ratio`` is ``lr_local / lr``, ``n`` the number of workers; the rows
    are the recurrence of the module docstring.
    """
    c = lr_ratio * x / n
    mu, la = momentum, 1.0 if lookahead else 0.0
    u_new = np.array([0.0, mu, x, 0.0, 0.0])
    w_g_new = np.array([1.0, 0.0, 0.0, 0.0, 0.0]) - u_new
    m_new = np.array([0.0, 0.0, 0.0, -c, local_momentum])
    return np.array([
        w_g_new,
        u_new,
        [0.0, 0.0, 0.0, 1.0, 0.0],
        w_g_new + m_new - la * mu * u_new,
        m_new,
    ])


def spectral_radius(matrices: np.ndarray) -> np.ndarray:
    """The largest eigenvalue modulus of each matrix of a stack (``(..., k, k)``)."""
    return np.abs(np.linalg.eigvals(matrices)).max(axis=-1)


def stable_limit(matrix_of: Callable[[float], np.ndarray], x_max: float, *,
                 grid: int = 2000, tol: float = 1e-12) -> float:
    """The largest ``x*`` with ``spectral_radius(matrix_of(x)) < 1`` on all of ``(0, x*)``.

    Geometric grid scan of ``[x_max * 1e-5, x_max]`` for the first unstable
    point, then bisection between it and the stable point before it, to a
    relative width ``tol``. ``math.inf`` if the whole grid is stable; 0.0 if
    its first point is already unstable.
    An unstable window narrower than the grid's spacing (0.6 % of ``x`` by
    default) between two stable points would be missed;
    ``tests/unit/test_stability.py`` checks the bounds by iterating the recurrences
    just below and just above them.
    """
    xs = np.geomspace(x_max * 1e-5, x_max, grid)
    unstable = spectral_radius(np.stack([matrix_of(float(x)) for x in xs])) >= 1.0
    if not unstable.any():
        return math.inf
    first = int(np.argmax(unstable))
    if first == 0:
        return 0.0
    lo, hi = float(xs[first - 1]), float(xs[first])
    while hi - lo > tol * hi:
        mid = 0.5 * (lo + hi)
        if spectral_radius(matrix_of(mid)) < 1.0:
            lo = mid
        else:
            hi = mid
    return lo


def ssgd_closed_form(momentum: float) -> float:
    """SSGD's bound in closed form: ``lr*h < 2*(1 + mu)`` (for ``0 <= mu < 1``)."""
    return 2.0 * (1.0 + momentum)


def ssgd_bound(momentum: float) -> float:
    """The largest stable ``lr*h`` of SSGD with heavy-ball momentum (numerically)."""
    return stable_limit(lambda x: ssgd_matrix(x, momentum), _x_max(momentum))


def odsgd_bound(momentum: float, lr_ratio: float = 1.0, n: int = 4,
                lookahead: bool = False, local_momentum: float = 0.0) -> float:
    """The largest stable ``lr*h`` of OD-SGD's delayed recurrence (:func:`odsgd_matrix`).

    ``lr_ratio = lr_local / lr``: 1 is the paper's default (``--lr-local`` =
    ``--lr``), ``n`` the default of ``--local-lookahead``.
    """
    return stable_limit(
        lambda x: odsgd_matrix(x, momentum, lr_ratio, n, lookahead, local_momentum),
        _x_max(momentum))


def _x_max(momentum: float) -> float:
    """The end of the scan: twice SSGD's bound (no recurrence here is found past it)."""
    return 2.0 * ssgd_closed_form(momentum)


class StabilityBounds(NamedTuple):
    """The largest stable ``lr*h`` of SSGD and of OD-SGD for the same momentum."""

    ssgd: float
    odsgd: float


def stability_bounds(momentum: float, lr_ratio: float = 1.0, n: int = 4,
                     lookahead: bool = False, local_momentum: float = 0.0) -> StabilityBounds:
    """The largest ``lr*h`` for which each recurrence is stable on ``f = h/2 * w**2``.

    ``momentum``: the heavy-ball momentum of SSGD and of OD-SGD's global step;
    ``lr_ratio``: ``lr_local / lr``; ``n``: workers; ``lookahead``:
    ``--local-lookahead``; ``local_momentum``: ``--local-momentum``.
    """
    return StabilityBounds(ssgd_bound(momentum),
                           odsgd_bound(momentum, lr_ratio, n, lookahead, local_momentum))


def stability_line(lr: float, momentum: float, lr_local: float, n: int,
                   lookahead: bool = False, local_momentum: float = 0.0) -> str:
    """One line with a run's bounds in ``lr*h`` and in the curvature ``h`` itself, e.g.

    ``stability on a quadratic of curvature h (lr 0.1, momentum 0.9, lr_local 0.1,
    N 4): SSGD lr*h < 3.8 (h < 38), OD-SGD lr*h < 0.105 (h < 1.05)``.
    """
    bounds = stability_bounds(momentum, lr_local / lr, n, lookahead, local_momentum)
    name = "OD-SGD+la" if lookahead else "OD-SGD"
    extra = f", local momentum {local_momentum:g}" if local_momentum else ""
    return (f"stability on a quadratic of curvature h (lr {lr:g}, momentum {momentum:g}, "
            f"lr_local {lr_local:g}, N {n}{extra}): "
            f"SSGD lr*h < {bounds.ssgd:.3g} (h < {bounds.ssgd / lr:.3g}), "
            f"{name} lr*h < {bounds.odsgd:.3g} (h < {bounds.odsgd / lr:.3g})")


def bounds_table(momenta: tuple[float, ...] = (0.0, 0.9), workers: tuple[int, ...] = (4, 8),
                 local_momentum: float = 0.0) -> str:
    """The Markdown table of ``ALGORITHMS.md`` ("OD-SGD", "Stability"): the bound of
    SSGD and of OD-SGD with lr_local = lr and = N*lr, without and with the look-ahead."""
    lines = ["| mu | N | SSGD | OD-SGD, lr_local = lr | OD-SGD, lr_local = N*lr "
             "| look-ahead, lr_local = lr | look-ahead, lr_local = N*lr |",
             "|----|---|------|------|------|------|------|"]
    for mu in momenta:
        for n in workers:
            cells = [ssgd_bound(mu)]
            for lookahead in (False, True):
                cells += [odsgd_bound(mu, ratio, n, lookahead, local_momentum)
                          for ratio in (1.0, float(n))]
            lines.append(f"| {mu:g} | {n} | " + " | ".join(f"{c:.4g}" for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(bounds_table())
    print(stability_line(0.1, 0.9, 0.1, 4))
