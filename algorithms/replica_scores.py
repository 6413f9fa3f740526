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
