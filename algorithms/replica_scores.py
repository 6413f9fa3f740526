"""The accuracy of every rank's own model, where the ranks' models differ.

A decentralized strategy (D-PSGD, AD-PSGD) evaluates the average x_bar of the ranks'
models, which no rank holds; what each rank would deploy is its own x_i. Lian et al.
(2017, 2018) report x_bar, and the gap to the ranks' own models grows with the
consensus distance. At each evaluation (and only then: one ``Allreduce`` of two numbers)
every rank scores its own model on the whole test split, and the run keeps their mean
and worst (root attributes ``replica_accuracy_mean``, ``replica_accuracy_worst``, one
value per evaluation, at the global samples of ``consensus_samples``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from syncbench.algorithms.mpi import MPI


def consensus_arrays(log: dict[int, float]) -> dict[str, np.ndarray]:
    """A consensus log ((global samples) -> distance) as the run file and checkpoints keep
    it: ``consensus_samples`` and ``consensus_distance``, in sample order."""
    ordered = sorted(log.items())
    return {"consensus_samples": np.array([s for s, _ in ordered], dtype=np.int64),
            "consensus_distance": np.array([d for _, d in ordered], dtype=np.float64)}


def consensus_log(state: dict[str, Any]) -> dict[int, float]:
    """The inverse of :func:`consensus_arrays` (a checkpoint's)."""
    return dict(zip(np.asarray(state["consensus_samples"]).tolist(),
                    np.asarray(state["consensus_distance"]).tolist(), strict=True))


class ReplicaScores:
    """(global samples) -> (mean, worst) accuracy of the ranks' own models."""

    def __init__(self) -> None:
        self.log: dict[int, tuple[float, float]] = {}

    def record(self, mpi_comm: Any, samples: int, own: Any,
               score: Callable[[Any], float]) -> None:
        """Score this rank's model ``own`` and keep the ranks' mean and worst (collective)."""
        accuracy = float(score(own))
        values = np.array([accuracy, -accuracy])
        total = np.zeros(1)
        mpi_comm.Allreduce(values[:1], total, op=MPI.SUM)
        worst = np.zeros(1)
        mpi_comm.Allreduce(values[1:], worst, op=MPI.MAX)
        self.log[int(samples)] = (float(total[0]) / mpi_comm.Get_size(), -float(worst[0]))

    def attributes(self) -> dict[str, np.ndarray]:
        """The root attributes, in the order of the evaluations' samples."""
        log = sorted(self.log.items())
        return {"replica_accuracy_mean": np.array([m for _, (m, _) in log], np.float64),
                "replica_accuracy_worst": np.array([w for _, (_, w) in log], np.float64)}

    def state(self) -> dict[str, np.ndarray]:
        log = sorted(self.log.items())
        return {"replica_samples": np.array([s for s, _ in log], np.int64),
                **self.attributes()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state` (a checkpoint written before these scores: none)."""
        samples = np.asarray(state.get("replica_samples", []), np.int64).tolist()
        mean = np.asarray(state.get("replica_accuracy_mean", []), np.float64).tolist()
        worst = np.asarray(state.get("replica_accuracy_worst", []), np.float64).tolist()
        self.log = {s: (m, w) for s, m, w in zip(samples, mean, worst, strict=True)}


class ReplicaReport:
    """What a decentralized strategy reports of its differing replicas, in one place for
    D-PSGD and AD-PSGD: the consensus average x_bar (computed once per evaluation point)
    with its distance logged at the point's global samples, the ranks' own models'
    scores, and both published into the strategy's ``run_attributes`` whenever they
    change and checkpointed with its state."""

    def __init__(self, attributes: dict[str, Any]) -> None:
        self.attributes = attributes
        #: (global samples) -> consensus distance, of every evaluation.
        self.consensus_log: dict[int, float] = {}
        #: The accuracy of the ranks' own models at every evaluation (mean, worst).
        self.scores = ReplicaScores()
        self._average: tuple[int, Any] | None = None  # (steps_taken, x_bar)

    def consensus(self, steps: int, samples: Callable[[], int],
                  compute: Callable[[], tuple[Any, float]]) -> Any:
        """x_bar at step ``steps``: ``compute()`` (collective: (x_bar, distance)) once per
        step count, its distance logged at ``samples()``."""
        if self._average is None or self._average[0] != steps:
            average, distance = compute()
            self._average = (steps, average)
            self.consensus_log[int(samples())] = distance
            self.publish()
        return self._average[1]

    def score(self, mpi_comm: Any, samples: int, own: Any,
              score: Callable[[Any], float]) -> None:
        """:meth:`ReplicaScores.record`, then published (collective)."""
        self.scores.record(mpi_comm, samples, own, score)
        self.publish()

    def publish(self) -> None:
        self.attributes.update(consensus_arrays(self.consensus_log))
        self.attributes.update(self.scores.attributes())

    def state(self) -> dict[str, np.ndarray]:
        return {**consensus_arrays(self.consensus_log), **self.scores.state()}

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state`; the next :meth:`consensus` computes x_bar again."""
        self.consensus_log = consensus_log(state)
        self.scores.load_state(state)
        self._average = None
        self.publish()
