"""The stability bounds of analysis/stability.py, checked by iterating the recurrences.

On ``f(w) = h/2 * w**2`` with every worker's gradient equal, each recurrence
is iterated directly (scalar loops written from ``algorithms/odsgd.py``'s
step order, not from the matrices) just below and just above the bound: below
it the iterates decay, above it they blow up. The OD-SGD loop itself is
checked against :class:`~syncbench.algorithms.odsgd.ODSGD` run on the same
quadratic (N identical workers behind a fake communicator).

Split off this module: ``tests/e2e/test_stability_e2e.py`` (its tests that launch a process
or start MPI).
"""

from __future__ import annotations

import math

import pytest

from syncbench.analysis.stability import (
    odsgd_bound,
    ssgd_bound,
    ssgd_closed_form,
    stability_bounds,
    stability_line,
)

H = 2.5  # the curvature: the bounds are in lr*h, so lr = x / H
STEPS = 20_000  # >= 2x the steps a factor e^-7 takes at 2 % from the slowest bound here
BLOWN = 1e12


def simulate_ssgd(x: float, mu: float, steps: int = STEPS) -> float:
    """Heavy-ball SSGD (``v = mu*v + g``, ``w -= lr*v``) from w = 1: the last |w|."""
    lr, w, v = x / H, 1.0, 0.0
    for _ in range(steps):
        v = mu * v + H * w
        w -= lr * v
        if abs(w) > BLOWN:
            break
    return abs(w)


def simulate_odsgd(x: float, mu: float, lr_ratio: float, n: int, lookahead: bool = False,
                   local_momentum: float = 0.0, steps: int = STEPS,
                   trajectory: list | None = None) -> float:
    """OD-SGD after the warm-up (``--warmup-steps 0``), n equal workers, from W = 1.

    Step t: ``g = h*W_loc``; the previous step's gradient sum (not yet applied)
    goes into GlobalOpt, ``v = mu*v + gsum/n``, ``W_g -= lr*v``; then the local
    step from the new W_g. Returns the last ``max(|W_g|, |W_loc|)``.
    """
    lr = x / H
    lr_local = lr_ratio * lr
    w_g = w_loc = 1.0
    v = mom = 0.0
    pending = None
    amplitude = 1.0
    for _ in range(steps):
        g = H * w_loc
        if pending is not None:
            v = mu * v + pending / n
            w_g -= lr * v
        pending = n * g  # the Iallreduce of n equal gradients
        step = -lr_local * g / n
        if local_momentum:
            mom = local_momentum * mom + step
            step = mom
        w_loc = w_g + step - (lr * mu * v if lookahead else 0.0)
        if trajectory is not None:
            trajectory.append((w_g, w_loc))
        amplitude = max(abs(w_g), abs(w_loc))
        if amplitude > BLOWN:
            break
    return amplitude


ODSGD_CASES = [  # (mu, lr_local / lr, N, lookahead, local momentum)
    (0.9, 1.0, 4, False, 0.0),  # the paper's recurrence with --lr-local = --lr
    (0.9, 4.0, 4, False, 0.0),
    (0.9, 1.0, 8, False, 0.0),
    (0.0, 1.0, 4, False, 0.0),
    (0.9, 4.0, 4, True, 0.0),  # the look-ahead with its default lr_local = N*lr
    (0.9, 1.0, 4, True, 0.0),
    (0.9, 1.0, 4, False, 0.1),  # local momentum 0.1 (the paper's fit.py default)
    (0.9, 4.0, 4, True, 0.1),
]


@pytest.mark.parametrize("mu", [0.0, 0.9])
def test_ssgd_bound_is_the_closed_form_and_holds(mu):
    bound = ssgd_bound(mu)
    assert bound == pytest.approx(ssgd_closed_form(mu), rel=1e-9)
    assert simulate_ssgd(0.98 * bound, mu) < 1e-4
    assert simulate_ssgd(1.02 * bound, mu) > 1e4


@pytest.mark.parametrize("mu,ratio,n,lookahead,local_momentum", ODSGD_CASES)
def test_odsgd_bound_holds_just_below_and_just_above(mu, ratio, n, lookahead, local_momentum):
    bound = odsgd_bound(mu, ratio, n, lookahead, local_momentum)
    assert 0 < bound < math.inf
    assert simulate_odsgd(0.98 * bound, mu, ratio, n, lookahead, local_momentum) < 1e-4
    assert simulate_odsgd(1.02 * bound, mu, ratio, n, lookahead, local_momentum) > 1e4


def test_the_filed_numbers_and_the_closed_forms():
    """SSGD mu 0.9: 3.8; the paper's recurrence, N 4: 0.105 (lr_local = lr), 0.125 (N*lr)."""
    assert round(ssgd_bound(0.9), 6) == 3.8
    assert round(odsgd_bound(0.9, 1.0, 4), 3) == 0.105
    assert round(odsgd_bound(0.9, 4.0, 4), 3) == 0.125
    for n in (4, 8):  # mu = 0: characteristic polynomial z^2 + (c - 1) z + (x - c), c = r x / N
        assert odsgd_bound(0.0, 1.0, n) == pytest.approx(n / (n - 1), rel=1e-9)
        assert odsgd_bound(0.0, float(n), n) == pytest.approx(2.0, rel=1e-9)
    for mu in (0.0, 0.5, 0.9):
        # no local step (W_loc = W_g): one-step-delayed heavy ball, lr*h < 1 - mu
        assert odsgd_bound(mu, 0.0, 4) == pytest.approx(1.0 - mu, rel=1e-9)
        # the look-ahead with lr_local = N*lr computes on the next W_g: SSGD's bound
        assert odsgd_bound(mu, 4.0, 4, lookahead=True) == pytest.approx(2 * (1 + mu), rel=1e-9)
    assert stability_bounds(0.9, 1.0, 4) == (ssgd_bound(0.9), odsgd_bound(0.9, 1.0, 4))


def test_stability_line():
    line = stability_line(0.1, 0.9, 0.1, 4)
    assert line == ("stability on a quadratic of curvature h (lr 0.1, momentum 0.9, "
                    "lr_local 0.1, N 4): SSGD lr*h < 3.8 (h < 38), OD-SGD lr*h < 0.105 (h < 1.05)")
    assert "OD-SGD+la lr*h < 3.8" in stability_line(0.1, 0.9, 0.4, 4, lookahead=True)
    assert "local momentum 0.1)" in stability_line(0.1, 0.9, 0.1, 4, local_momentum=0.1)
