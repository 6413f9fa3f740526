"""The algorithm interface every synchronization strategy implements.

The training driver owns the data, the timers, evaluation and the run file;
an algorithm owns how one step of one rank computes, communicates and
updates. One call to :meth:`Algorithm.step` consumes exactly one mini-batch
of this rank. A strategy is one module that subclasses :class:`Algorithm`
plus one line in :mod:`syncbench.algorithms.registry`; its traits
(:meth:`Algorithm.traits`) tell analysis and the simulator, through the run file,
what they need to know of it, so that nothing outside the strategy is keyed by
its name.
"""

from __future__ import annotations

import argparse
import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from syncbench.algorithms.communicator import Communicator
from syncbench.algorithms.flags import add_option_flags, options_from
from syncbench.algorithms.optimizer import MomentumSGD
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
    """The sample budget every algorithm must consume (equal work for all).

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
class NoOptions:
    """The options of a strategy that has none of its own."""


class Algorithm(ABC):
    """One synchronization strategy, run by every rank.

    Its own options are a frozen dataclass, :attr:`Options`
    (:mod:`syncbench.algorithms.flags`); ``config`` carries the driver's
    flags the optimizer reads (``lr``, ``momentum``, ``weight_decay``).
    """

    #: This strategy's typed options (fields with help; validated on construction).
    Options: ClassVar[type] = NoOptions

    #: Registry name, e.g. ``"ssgd"``.
    name: ClassVar[str]
    #: One-line description for ``--help``.
    summary: ClassVar[str] = ""
    #: Leading steps per rank that are warm-up (root attribute ``warmup_steps``).
    warmup_steps: int = 0

    # Capabilities: the driver checks its own flags against these (one error
    # line naming the strategy), so a strategy never polices driver flags.
    #: ``--checkpoint-every``/``--resume``: :meth:`state` and :meth:`load_state`
    #: resume the run exactly (at evaluation points, or :meth:`pause_point`).
    supports_checkpoint: ClassVar[bool] = True
    #: ``--stop-at-target``: evaluation points occur during training.
    supports_stop_at_target: ClassVar[bool] = True
    #: Same flags and seed give bit-identical parameters (no decision depends
    #: on timing or on the order in which ranks arrive).
    deterministic: ClassVar[bool] = True
    #: Every rank takes the same number of steps, and step i of every rank runs
    #: the same collectives: ``--sync-bn`` may reduce inside a step.
    lock_step: ClassVar[bool] = True

    # Traits: what analysis and the simulator know of this strategy, from the run
    # file (``syncbench.analysis.schema.StrategyTraits``, written from :meth:`traits`).
    # A subclass inherits its parent's (one derived from SSGD simulates as SSGD).
    #: The phases of a step in the order this strategy runs them (lock-step: compute,
    #: then communicate; the same as ``schema.LOCK_STEP_ORDER``).
    step_order: ClassVar[tuple[str, ...]] = ("data", "compute", "delay", "comm", "wait",
                                             "update")
    #: A phase run twice in a step around compute -> the share of its seconds before compute.
    split_phases: ClassVar[dict[str, float]] = {}
    #: The hidden-communication fraction against the blocking-Allreduce reference applies.
    hides_comm: ClassVar[bool] = False
    #: Evaluation rows come from parameter copies evaluated after training (no pauses).
    snapshot_evaluations: ClassVar[bool] = False
    #: (config flag, value, label suffix) of variants that are not the published algorithm.
    label_variants: ClassVar[tuple[tuple[str, Any, str], ...]] = ()
    #: The communication pattern the simulator models for this strategy ("": none).
    simulation: ClassVar[str] = ""

    @classmethod
    def traits(cls) -> dict[str, Any]:
        """This strategy's traits as plain data, keyed by ``StrategyTraits``' field names."""
        return {"step_order": tuple(cls.step_order), "split_phases": dict(cls.split_phases),
                "hides_comm": bool(cls.hides_comm),
                "snapshot_evaluations": bool(cls.snapshot_evaluations),
                "label_variants": tuple(tuple(v) for v in cls.label_variants),
                "simulation": str(cls.simulation)}

    def __init__(
        self,
        model: Model,
        comm: Communicator,
        config: argparse.Namespace,
        budget: Budget,
        options: Any = None,
    ) -> None:
        #: This strategy's options: ``options``, else built from ``config``'s attributes.
        self.options = options if options is not None else options_from(self.Options, config)
        self.model = model
        self.comm = comm
        self.timer = comm.timer
        self.config = config
        self.budget = budget
        self.steps_taken = 0
        self.optimizer = MomentumSGD(
            model.params, config.lr, config.momentum, config.weight_decay,
            model.decay_mask() if config.wd_exempt else None,
        )
        #: Heterogeneity emulation, set by the driver (``bench.slowdown.Slowdown``):
        #: called with the step's compute seconds, it spends the extra time.
        self.slowdown: Callable[[float], float] | None = None

    def drive_progress(self) -> None:
        """Let MPI progress this rank's outstanding requests (one cheap ``Testall``).

        The emulated slowdown calls it during its delay, as a slower processor
        would poll between the layers it is still computing. Algorithms whose
        progress is not in ``Communicator.outstanding`` override it.
        """
        self.comm.poll()

    def straggle(self) -> None:
        """Inject this rank's emulated slowdown after the step's compute phase.

        Every algorithm calls it right after computing the gradient, so all
        of them get the same straggler (``--slowdown-mode``: work, spin or
        sleep, scaled from the running median of this rank's compute); the
        time is charged to the ``delay`` phase.
        """
        if self.slowdown is not None:
            with self.timer.phase("delay"):
                self.slowdown(self.timer.totals["compute"])

    @classmethod
    def add_arguments(cls, parser: argparse._ArgumentGroup,
                      seen: dict[str, dataclasses.Field] | None = None) -> None:
        """One flag per field of :attr:`Options` (``seen``: flags of other strategies)."""
        add_option_flags(parser, cls.Options, {} if seen is None else seen)

    @classmethod
    def validate(cls, config: argparse.Namespace, world_size: int) -> None:
        """Raise ``ValueError`` with a one-line message for bad flags (all ranks agree)."""
        cls.check_world(options_from(cls.Options, config), world_size)

    @classmethod
    def check_world(cls, options: Any, world_size: int) -> None:
        """Checks of the options that depend on the number of ranks; default none."""

    @classmethod
    def data_shard(cls, config: argparse.Namespace, rank: int, size: int) -> tuple[int, int]:
        """(shard index, shard count) of rank ``rank``'s training data: every rank trains."""
        return rank, size

    def prepare(self) -> None:
        """Collective set-up before the clock starts (e.g. RMA windows); default none."""

    def pause_point(self) -> int | None:
        """Global samples of a checkpoint pause this rank must join now, else None.

        For algorithms without evaluation points (ASGD): when not None every
        rank gets the same value, the driver checkpoints (collective) off the
        training clock, and training continues. A negative value, the same on
        every rank: the pause was dropped (the run ended early), the driver
        checks :meth:`done` again without a step. The default: no pauses.
        """
        return None

    def end_early(self) -> bool:
        """End every rank's training at its next step boundary; True if this cut the run.

        Only for strategies without evaluation points (the driver calls it on
        the rank a signal reached; :mod:`syncbench.bench.train.stopping`): lock-step
        strategies stop at an agreed evaluation point instead, so the default
        does nothing and returns False.
        """
        return False

    @property
    def stop_vote_lag(self) -> int:
        """Evaluation points between posting a stop vote and completing it
        (:mod:`syncbench.bench.train.stopping`); the same on every rank.

        1 is enough where a blocking reduction of every rank lies between two
        points: a rank past point n+1 knows every rank posted vote n. The default,
        2, also holds where the reduction of step n is completed at step n+1
        (OD-SGD's delayed allreduce, Oscars ``--overlap``).
        """
        return 2

    def stop_requested(self) -> bool:
        """True once a signal asked this rank to stop (the driver replaces it; see
        :class:`~syncbench.bench.train.hooks.StopOnSignal`). A strategy without
        evaluation points checks it where it waits outside steps, and ends early."""
        return False

    def early_end_point(self) -> int | None:
        """After :meth:`finish` (collective): the global samples of a run that
        :meth:`end_early` cut, if its state there can be checkpointed; else None.

        The default (lock-step strategies, which checkpoint at the agreed stop
        point instead): None.
        """
        return None

    @abstractmethod
    def step(self, x: Any, y: Any) -> StepStats:
        """Train on this rank's mini-batch (x, y): compute, communicate, update."""

    def done(self) -> bool:
        """True once this rank has consumed its share of the sample budget."""
        return self.steps_taken >= self.budget.steps_per_rank

    def evaluation_point(self) -> int | None:
        """Global samples seen, if every rank is at this same point now; else None.

        At such a point the driver may call :meth:`consensus_params` on every
        rank (it may be collective). The default fits lock-step algorithms.
        """
        return self.steps_taken * self.budget.batch_size * self.comm.size

    def snapshot_point(self) -> int | None:
        """For algorithms without evaluation points: global samples in ``model.params``.

        An asynchronous algorithm's ranks never stop together, but a rank's
        current parameters may be a faithful copy of the global model (ASGD's
        last pull). Returning the samples that copy includes lets the driver
        keep it when it crosses an evaluation stride and evaluate it after
        training, off the clock. None (the default): no such copy.
        """
        return None

    def consensus_params(self) -> Any:
        """The model to evaluate (called on every rank at an evaluation point)."""
        return self.model.params

    def consensus_buffers(self) -> Any:
        """The running statistics (BatchNorm) evaluated with :meth:`consensus_params`, called
        right after it. The default: this rank's (rank 0 evaluates), per-rank statistics
        unless ``--sync-bn`` makes them global, as DDP's ``broadcast_buffers`` uses rank
        0's. Strategies that average models average them too."""
        return self.model.buffers

    def local_params(self) -> Any:
        """This rank's own weights, for ``--eval-model local`` (the model's parameters; OD-SGD's
        W_loc)."""
        return self.model.params

    def state(self) -> dict[str, Any]:
        """This rank's resumable state (arrays and numbers), for ``--checkpoint-every``.

        Called at an evaluation point, after :meth:`finish`-like draining is
        not needed: lock-step algorithms have nothing in flight there.
        Subclasses extend the dict with their own state.
        """
        return {
            "params": self.model.backend.to_numpy(self.model.params).copy(),
            "buffers": self.model.backend.to_numpy(self.model.buffers).copy(),
            "velocity": self._velocity_state(),
            "steps_taken": self.steps_taken,
        }

    def _velocity_state(self) -> Any:
        """A host copy of the velocity :meth:`state` saves: the optimizer's by default
        (a strategy that keeps its own velocity, ASGD, returns that one instead)."""
        return self.model.backend.to_numpy(self.optimizer.velocity).copy()

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state` saved (the inverse, on the same rank)."""
        self.model.params[...] = self.model.backend.asarray(state["params"])
        self.optimizer.velocity[...] = self.model.backend.asarray(state["velocity"])
        if "buffers" in state and np.size(state["buffers"]):
            self.model.buffers[...] = self.model.backend.asarray(state["buffers"])
        self.steps_taken = int(state["steps_taken"])

    def report_line(self) -> str | None:
        """A line of this strategy's own measurements for rank 0 to print, else None.

        Called by the driver on every rank after :meth:`finish`, off the
        clock (it may be collective); default: nothing to report.
        """
        return None

    def finish(self) -> None:
        """Drain outstanding communication so :meth:`consensus_params` is final."""

    def close(self) -> None:
        """Release MPI resources (windows, requests); also called on error paths."""
