"""The lock-step core every synchronization strategy is built on.

The training driver owns the data, the timers, evaluation and the run file; a
strategy owns how one step of one rank computes, communicates and updates. One call
to :meth:`Strategy.step` consumes exactly one mini-batch of this rank.

A strategy is a small class that composes parts over this core, as PyTorch composes a
DDP communication hook with an optimizer and ``PostLocalSGDOptimizer`` a local
optimizer with a ``ModelAverager``:

- a gradient reducer (:mod:`syncbench.algorithms.reducers`): this step's local
  gradients -> the global mean gradient (blocking, bucket by bucket, one step late);
- a model averager (:mod:`syncbench.algorithms.averagers`): when and how replicas are
  averaged (every H steps, adaptively);
- an outer optimizer (:mod:`syncbench.algorithms.outer`): what an averaged
  pseudo-gradient does to the parameters;
- a local optimizer (:mod:`syncbench.algorithms.optimizer`): momentum SGD.

The lock-step contract, what the driver calls and a strategy may override, is thirteen
members: ``name``, ``summary``, ``Options``, ``traits`` (class-level), and
:meth:`~Strategy.step`, :meth:`~Strategy.done`, :meth:`~Strategy.evaluation_point`,
:meth:`~Strategy.consensus_params`, :meth:`~Strategy.score_replicas`,
:meth:`~Strategy.state`, :meth:`~Strategy.load_state`, :meth:`~Strategy.finish`,
:meth:`~Strategy.close`.
A strategy whose ranks do not stop together (ASGD) also implements
:class:`~syncbench.algorithms.not_lock_step.NotLockStep`, a separate protocol that
no lock-step strategy sees. Register a strategy with one line in
:mod:`syncbench.algorithms.registry`; its :attr:`Strategy.traits` tell analysis and
the simulator, through the run file, what they need to know of it, so that nothing
outside the strategy is keyed by its name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from syncbench.algorithms.flags import StrategyOptions, options_from
from syncbench.algorithms.local_optimizer import build_local_optimizer
from syncbench.algorithms.traits import StrategyTraits

if TYPE_CHECKING:
    from syncbench.algorithms.communicator import Communicator
    from syncbench.kernels.model import Model


@dataclass
class StepStats:
    """What one step reports besides its phase timings."""

    loss: float
    samples: int
    staleness: int = 0
    #: ASGD's lower bound of the staleness (``staleness`` is the upper bound).
    staleness_min: int = 0
    local_steps: int = 0
    round: int = 0
    #: Oscars' speed estimate c_k (seconds per local step) the step's schedule used.
    speed: float = 0.0


@dataclass(frozen=True)
class Budget:
    """The sample budget every strategy must consume (equal work for all).

    ``steps_per_rank`` is the number of steps a rank takes when every rank
    steps at the same rate (SSGD); ``total_samples`` is the global budget.
    """

    total_samples: int
    batch_size: int
    world_size: int

    @property
    def steps_per_rank(self) -> int:
        return self.total_samples // (self.batch_size * self.world_size)


def steps_per_rank(epochs: float, samples: int, world_size: int, batch_size: int) -> int:
    """Steps per rank for ``epochs`` passes over ``samples`` sharded over ``world_size`` ranks.

    ``epochs`` times the whole batches of one rank's shard
    (``samples // world_size // batch_size``), rounded down, at least 1: train's
    budget and the simulator's ``--epochs`` (so both take the same steps).
    """
    return max(1, int(epochs * (samples // world_size // batch_size)))


@dataclass(frozen=True)
class NoOptions(StrategyOptions):
    """The options of a strategy that has none of its own."""


class Strategy(ABC):
    """One synchronization strategy, run by every rank: the lock-step contract.

    Its own options are a frozen dataclass, :attr:`Options`
    (:mod:`syncbench.algorithms.flags`), validated on construction; a check that
    needs the number of ranks is the dataclass's ``check_world(world_size)``.
    ``config`` is the run's configuration (the optimizer reads ``optimizer``, ``lr``,
    ``momentum``, ``weight_decay``, ``wd_exempt``, and AdamW's ``beta1``, ``beta2``,
    ``eps``).

    Besides the contract the core gives a composition its services: ``model``,
    ``comm`` (the timed communicator), ``timer``, ``config``, ``budget``,
    ``optimizer`` (the local optimizer), ``steps_taken``, :meth:`straggle` (the
    emulated slowdown, after compute) and :meth:`compute_gradient`; and
    ``run_attributes``, root attributes of the run file a part declares (SSGD's
    ``buckets``, OD-SGD's ``warmup_steps``, a reducer's ``wire_bytes_per_step``).
    """

    #: Registry name, e.g. ``"ssgd"``.
    name: ClassVar[str]
    #: One-line description for ``--help``.
    summary: ClassVar[str] = ""
    #: This strategy's typed options (fields with help; validated on construction).
    Options: ClassVar[type] = NoOptions
    #: What analysis, the simulator and the driver know of this strategy
    #: (:class:`~syncbench.algorithms.traits.StrategyTraits`); a subclass inherits its
    #: parent's (one derived from SSGD simulates as SSGD). An instance may refine the
    #: capabilities from its options (Oscars' ``stop_vote_lag``).
    traits: ClassVar[StrategyTraits] = StrategyTraits()

    def __init__(self, model: Model, comm: Communicator, config: Any, budget: Budget,
                 options: Any = None) -> None:
        #: This strategy's options: ``options``, else built from ``config``.
        self.options = options if options is not None else options_from(self.Options, config)
        self.model = model
        self.comm = comm
        self.timer = comm.timer
        self.config = config
        self.budget = budget
        self.steps_taken = 0
        #: The local optimizer (``--optimizer``: momentum SGD or AdamW, this strategy's
        #: default first in ``traits.local_optimizers``).
        self.optimizer = build_local_optimizer(model, config, self.traits,
                                               budget.steps_per_rank)
        #: Heterogeneity emulation, set by the driver (``bench.slowdown.Slowdown``):
        #: called with the step's compute seconds, it spends the extra time.
        self.slowdown: Callable[[float], float] | None = None
        #: Root attributes of the run file this strategy's parts declare (numbers, or
        #: arrays of them); the driver reads them again when training ends.
        self.run_attributes: dict[str, Any] = {"buckets": 0, "warmup_steps": 0,
                                               "wire_bytes_per_step": 0}

    # -- services of the core ----------------------------------------------------
    def straggle(self) -> None:
        """Inject this rank's emulated slowdown after the step's compute phase.

        Every strategy calls it right after computing the gradient (a reducer that
        posts during backward, right before its last post), so all of them get the
        same straggler (``--slowdown-mode``: work, spin or sleep, scaled from the
        running median of this rank's compute); the time is charged to ``delay``.
        """
        if self.slowdown is not None:
            with self.timer.phase("delay"):
                self.slowdown(self.timer.totals["compute"])

    def compute_gradient(self, x: Any, y: Any, hooks: dict[str, Any] | None = None) -> float:
        """This rank's loss and gradient (in ``model.grads``) on (x, y), timed as
        ``compute``; ``hooks``: what backward calls between layers (a reducer's
        ``on_grads_ready`` and ``poll``)."""
        with self.timer.phase("compute"):
            return self.model.loss_and_grad(x, y, **(hooks or {}))

    # -- the lock-step contract ------------------------------------------------
    @abstractmethod
    def step(self, x: Any, y: Any) -> StepStats:
        """Train on this rank's mini-batch (x, y): compute, communicate, update."""

    def done(self) -> bool:
        """True once this rank has consumed its share of the sample budget."""
        return self.steps_taken >= self.budget.steps_per_rank

    def evaluation_point(self) -> int | None:
        """Global samples seen, if every rank is at this same point now; else None.

        At such a point the driver may call :meth:`consensus_params` on every rank (it
        may be collective); ``model.buffers`` are evaluated with it (a strategy that
        averages models averages them too; otherwise rank 0's, as DDP's
        ``broadcast_buffers``). The default fits lock-step strategies.
        """
        return self.steps_taken * self.budget.batch_size * self.comm.size

    def consensus_params(self) -> Any:
        """The model to evaluate (called on every rank at an evaluation point)."""
        return self.model.params

    def score_replicas(self, score: Callable[[Any], float]) -> None:
        """At an evaluation, after :meth:`consensus_params` (collective): where the ranks'
        own models differ from the evaluated one (decentralized strategies), score each
        with ``score`` (its accuracy on the whole test split) and keep the results
        (:mod:`~syncbench.algorithms.replica_scores`). Default: nothing to score."""

    def state(self) -> dict[str, Any]:
        """This rank's resumable state (arrays and numbers), for ``--checkpoint-every``.

        Called at an evaluation point, where lock-step strategies have nothing in
        flight. Subclasses extend the dict with their own state and their parts'.
        """
        to_numpy = self.model.backend.to_numpy
        return {
            "params": to_numpy(self.model.params).copy(),
            "buffers": to_numpy(self.model.buffers).copy(),
            **{key: (to_numpy(value).copy() if hasattr(value, "shape") else value)
               for key, value in self.optimizer.state().items()},
            "steps_taken": self.steps_taken,
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` saved (the inverse, on the same rank)."""
        self.model.params[...] = self.model.backend.asarray(state["params"])
        self.optimizer.load_state(state, self.model.backend.asarray)
        if "buffers" in state and np.size(state["buffers"]):
            self.model.buffers[...] = self.model.backend.asarray(state["buffers"])
        self.steps_taken = int(state["steps_taken"])

    def finish(self) -> None:
        """Drain outstanding communication so :meth:`consensus_params` is final."""

    def close(self) -> None:
        """Release MPI resources (windows, requests); also called on error paths."""
