"""Hierarchical Local SGD: local steps, node averages every H1, global averages every H2.

PyTorch's ``PostLocalSGDOptimizer`` over a ``HierarchicalModelAverager``
(:mod:`~syncbench.algorithms.averagers.hierarchical`): every rank takes local steps with
the local optimizer; every ``--node-period`` H1 steps the ranks of one node average
their replicas (one blocking ``Allreduce`` on the node's communicator, the fast link),
every ``--global-period`` H2 steps (a multiple of H1) every rank does (the slow link),
and the budget's last step always averages every rank. Nodes are the ranks that share
memory; ``--group-size G`` takes blocks of G consecutive ranks instead, to stand in for
nodes on one host. Fewer than two groups, or groups of unequal size, is an error (one
node: use ``localsgd``). With H1 = H2 it is Local SGD with ``--period`` H2.

Evaluation points and checkpoints are the global averages (every replica equal).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from syncbench.algorithms.averagers import round_wire_bytes
from syncbench.algorithms.averagers.hierarchical import HierarchicalAverager, group_communicator
from syncbench.algorithms.base import StepStats, Strategy
from syncbench.algorithms.flags import StrategyOptions, option
from syncbench.algorithms.localsgd import local_step
from syncbench.algorithms.traits import LOCAL_FIRST_ORDER, StrategyTraits


class Hierarchical(Strategy):
    name = "hierarchical"
    summary = ("hierarchical local SGD: a node's ranks average every --node-period steps, "
               "every rank every --global-period")
    #: Simulated per node and group (``bench/simulate/hierarchical.py``).
    traits = StrategyTraits(step_order=LOCAL_FIRST_ORDER, simulation="hierarchical",
                            stop_vote_lag=1)

    @dataclass(frozen=True)
    class Options(StrategyOptions):
        """Hierarchical Local SGD's options."""

        node_period: int = option(2, "hierarchical H1: local steps between node averages")
        global_period: int = option(
            8, "hierarchical H2: local steps between averages of every rank (a multiple of "
            "--node-period)")
        group_size: int = option(
            0, "hierarchical: ranks per group, consecutive (0, default: the ranks of one node)")

        def __post_init__(self) -> None:
            if self.node_period < 1:
                raise ValueError(f"--node-period must be >= 1, got {self.node_period}")
            checks = [
                (self.global_period >= 1 and self.global_period % self.node_period == 0,
                 f"--global-period must be a multiple of --node-period {self.node_period}, "
                 f"got {self.global_period}"),
                (self.group_size >= 0, f"--group-size must be >= 0, got {self.group_size}"),
            ]
            for ok, message in checks:
                if not ok:
                    raise ValueError(message)

        def check_run(self, config: Any, world_size: int) -> None:
            g = self.group_size
            if g and (world_size % g or world_size // g < 2):
                raise ValueError(f"--group-size {g} must divide the {world_size} ranks into 2 "
                                 "or more groups")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        options = self.options
        self.averager = HierarchicalAverager(
            self, options.node_period, options.global_period,
            group_communicator(self, options.group_size), "keep")
        # every H2 steps: H2 / H1 averages of the weights and BatchNorm's statistics, the
        # node averages (which cross no slow link) and the global one
        self.run_attributes["wire_bytes_per_outer_step"] = (
            options.global_period // options.node_period
            * round_wire_bytes(self, "keep", int(self.model.params.nbytes)))
        self.run_attributes["outer_period_steps"] = int(options.global_period)

    def step(self, x: Any, y: Any) -> StepStats:
        loss = local_step(self, x, y)
        self.steps_taken += 1
        stats = StepStats(loss=loss, samples=int(x.shape[0]),
                          local_steps=self.options.global_period,
                          round=(self.steps_taken - 1) // self.options.global_period)
        self.averager.after_step()
        return stats

    def evaluation_point(self) -> int | None:
        """Global samples right after a global average (replicas equal), else None."""
        if self.averager.last_global != self.steps_taken:
            return None
        return super().evaluation_point()

    def load_state(self, state: dict[str, Any]) -> None:
        super().load_state(state)
        self.averager.last_global = self.steps_taken

    def close(self) -> None:
        self.averager.close()
