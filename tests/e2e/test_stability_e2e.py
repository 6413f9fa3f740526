"""The stability bounds of analysis/stability.py, checked by iterating the recurrences: the
tests that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_stability.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import train_config
from mpi4py import MPI
from test_stability import ODSGD_CASES, H, simulate_odsgd

from syncbench.algorithms.base import Budget
from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.registry import get_algorithm


class _Quadratic:
    """A one-parameter "model" with loss h/2 * w^2 (what ODSGD reads of a model)."""

    def __init__(self) -> None:
        self.params = np.ones(1)
        self.grads = np.zeros(1)

    def loss_and_grad(self, x, y, on_grads_ready=None, poll=None) -> float:
        self.grads[...] = H * self.params
        return 0.5 * H * float(self.params[0]) ** 2


class _EqualRanks:
    """The ``MPI.Comm`` of n ranks whose buffers are all equal: a sum is n times it."""

    def __init__(self, n: int) -> None:
        self.n = n

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return self.n

    def Allreduce(self, _in_place, buf, op=None) -> None:
        buf *= self.n

    def Iallreduce(self, _in_place, buf, op=None):
        buf *= self.n
        return MPI.REQUEST_NULL


@pytest.mark.parametrize("mu,ratio,n,lookahead,local_momentum", ODSGD_CASES[:1] + ODSGD_CASES[4:])
def test_the_simulated_recurrence_is_odsgds(mu, ratio, n, lookahead, local_momentum):
    """ODSGD on the quadratic (warm-up 0, weight decay 0) takes the simulated steps."""
    lr, steps = 0.02, 40
    config = train_config("--algorithm", "odsgd", "--lr", str(lr), "--momentum", str(mu),
                          "--weight-decay", "0", "--warmup-steps", "0",
                          "--lr-local", str(ratio * lr), "--local-momentum", str(local_momentum),
                          "--local-lookahead", "on" if lookahead else "off")
    model = _Quadratic()
    algo = get_algorithm("odsgd")(model, Communicator(_EqualRanks(n)), config,
                                  Budget(steps * n, 1, n))
    expected: list = []
    simulate_odsgd(lr * H, mu, ratio, n, lookahead, local_momentum, steps, expected)
    for w_g, w_loc in expected:
        algo.step(np.zeros((1, 1)), None)
        np.testing.assert_allclose([algo.w_global[0], model.params[0]], [w_g, w_loc],
                                   rtol=1e-12, atol=1e-15)
