"""The momentum optimizer's subnormal flush: decayed velocities do not stick below
``finfo.tiny`` (where x86 cores with microcode assists slow every later update), and
nothing else changes."""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.algorithms.optimizer import FLUSH_SUBNORMALS_EVERY, MomentumSGD
from syncbench.kernels.ops import flush_subnormals_, sgd_momentum_


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_flush_zeroes_exactly_the_subnormal_elements(dtype):
    info = np.finfo(dtype)
    x = np.array([info.smallest_subnormal, -3 * info.smallest_subnormal, info.tiny / 2,
                  info.tiny, -info.tiny, 1e-20, -2.5, 0.0, np.inf, np.nan], dtype=dtype)
    before = x.copy()
    flush_subnormals_(x, np.empty_like(x))
    np.testing.assert_array_equal(x[:3], 0)
    np.testing.assert_array_equal(x[3:], before[3:])  # NaN == NaN here


def test_a_velocity_whose_gradient_died_decays_to_zero_not_to_a_stuck_subnormal():
    """mu = 0.9 leaves 1-4 smallest subnormals fixed under rounding: plain decay sticks
    there for good, the optimizer's velocity reaches exact zero."""
    n, steps = 64, 1200
    live = np.zeros(n, np.float32)
    live[: n // 2] = 1e-3  # half the elements keep a gradient, half lost theirs
    opt = MomentumSGD(np.zeros(n, np.float32), 0.01, 0.9, 0.0)
    params = np.ones(n, np.float32)
    opt.velocity[:] = 1.0  # a velocity built up while every gradient was alive
    plain_w, plain_v = params.copy(), opt.velocity.copy()
    for _ in range(steps):
        opt.step(params, live)
        sgd_momentum_(plain_w, live, plain_v, 0.01, 0.9, 0.0, np.empty_like(plain_v))
    tiny = np.finfo(np.float32).tiny
    stuck = (plain_v != 0) & (np.abs(plain_v) < tiny)
    assert stuck[n // 2 :].all()  # what the flush is for: the plain update keeps them
    assert not ((opt.velocity != 0) & (np.abs(opt.velocity) < tiny)).any()
    np.testing.assert_array_equal(opt.velocity[n // 2 :], 0)
    # The elements above tiny went through the same arithmetic bit for bit.
    np.testing.assert_array_equal(opt.velocity[: n // 2], plain_v[: n // 2])
    np.testing.assert_array_equal(params, plain_w)
    assert steps > 1000 + FLUSH_SUBNORMALS_EVERY  # about 1000 steps from 1.0 to stuck
