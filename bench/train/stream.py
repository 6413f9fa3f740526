"""Per-rank sharding of the training set and the mini-batch stream of a rank.

The training set is permuted once with the run's seed and cut into
``world_size`` equal, disjoint shards (the remainder, fewer than
``world_size`` samples, is left out so every rank takes the same number of
steps per epoch). Each epoch a rank visits its shard in a fresh order drawn
from ``(seed, rank, epoch)``, in batches of ``batch_size``; a last partial
batch is dropped. Everything is deterministic, so a test can rebuild any
rank's batches serially.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from syncbench.kernels.backend import Backend, numpy_backend


def shard_indices(n_samples: int, rank: int, world_size: int, seed: int) -> np.ndarray:
    """Indices of rank ``rank``'s shard: disjoint across ranks, equal sizes."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} outside world of size {world_size}")
    per_rank = n_samples // world_size
    order = np.random.default_rng([seed, 0x5EED]).permutation(n_samples)
    return np.sort(order[rank * per_rank : (rank + 1) * per_rank])


class BatchStream:
    """Endless mini-batches of one rank's shard, reshuffled every epoch."""

    def __init__(
        self,
        x: np.ndarray,
        y: np.ndarray,
        rank: int,
        world_size: int,
        batch_size: int,
        seed: int,
        backend: Backend | None = None,
        dtype: Any = np.float32,
    ) -> None:
        self.x, self.y = x, y
        self.rank, self.batch_size, self.seed = rank, batch_size, seed
        self.indices = shard_indices(len(y), rank, world_size, seed)
        if batch_size > len(self.indices):
            raise ValueError(
                f"--batch-size {batch_size} is larger than a rank's shard "
                f"({len(self.indices)} samples on each of {world_size} ranks)"
            )
        self.backend = backend or numpy_backend()
        self.dtype = np.dtype(dtype)
        self.steps_per_epoch = len(self.indices) // batch_size
        self.position = 0  # batches handed out so far
        self._batches = self._generate(0)

    def epoch_order(self, epoch: int) -> np.ndarray:
        """The shard's visiting order in ``epoch``."""
        rng = np.random.default_rng([self.seed, self.rank, epoch])
        return self.indices[rng.permutation(len(self.indices))]

    def batch_indices(self, step: int) -> np.ndarray:
        """Sample indices of this rank's ``step``-th batch (0-based, across epochs)."""
        epoch, within = divmod(step, self.steps_per_epoch)
        order = self.epoch_order(epoch)
        return order[within * self.batch_size : (within + 1) * self.batch_size]

    def seek(self, step: int) -> None:
        """Continue with this rank's ``step``-th batch (resuming a run)."""
        self.position = step
        self._batches = self._generate(step)

    def _generate(self, start: int) -> Iterator[tuple[Any, Any]]:
        epoch, first = divmod(start, self.steps_per_epoch)
        while True:
            order = self.epoch_order(epoch)
            for i in range(first, self.steps_per_epoch):
                idx = np.sort(order[i * self.batch_size : (i + 1) * self.batch_size])
                yield self._take(idx)
            epoch, first = epoch + 1, 0

    def _take(self, idx: np.ndarray) -> tuple[Any, Any]:
        xb = self.backend.asarray(self.x[idx], dtype=self.dtype)
        yb = self.backend.asarray(self.y[idx])
        return xb, yb

    def next(self) -> tuple[Any, Any]:
        """The next (x, y) batch on the backend's device."""
        self.position += 1
        return next(self._batches)
