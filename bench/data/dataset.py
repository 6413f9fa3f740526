"""A loaded dataset (:class:`Dataset`) and the one-line error of a bad one (:class:`DatasetError`).

Benchmarks run unattended on clusters, so every way a file can be missing or
corrupt ends in a :class:`DatasetError` whose message is one line naming the
file, what is wrong with it and how to get a good copy, instead of a
traceback from deep inside NumPy halfway through an MPI job. The readers
(:mod:`~syncbench.bench.data.formats`), the generator
(:mod:`~syncbench.bench.data.synthetic`), the look-up
(:mod:`~syncbench.bench.data.catalog`) and the downloads
(:mod:`~syncbench.bench.data.fetch`) share these two types.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np


class DatasetError(Exception):
    """A dataset is missing, corrupt or unknown.

    ``str(e)`` is always a single line: it names the file or dataset, says what is wrong
    and how to get a good copy. Line breaks in the message (from a path or an OS error)
    are replaced by spaces.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).splitlines()))


@dataclass(eq=False)
class Dataset:
    """A loaded dataset: a train split and a held-out test split.

    Images are float32 arrays of shape ``(n, C, H, W)`` with values in ``[0, 1]``; labels
    are int64 arrays of shape ``(n,)`` with values in ``[0, num_classes)``. ``source`` is
    the directory the files came from, or ``"generated"``; ``files`` the files read, in a
    fixed order (none for generated data); ``generator`` the arguments that generated
    the data (empty for file datasets). The run file records them with a hash
    (:mod:`~syncbench.bench.data.provenance`).
    """

    name: str
    train_x: np.ndarray = field(repr=False)
    train_y: np.ndarray = field(repr=False)
    test_x: np.ndarray = field(repr=False)
    test_y: np.ndarray = field(repr=False)
    num_classes: int
    source: str
    files: tuple[str, ...] = ()
    generator: dict[str, Any] = field(default_factory=dict)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Shape of one sample, ``(C, H, W)``."""
        c, h, w = self.train_x.shape[1:]
        return (int(c), int(h), int(w))

    @property
    def num_train(self) -> int:
        """Number of training samples."""
        return int(self.train_x.shape[0])

    @property
    def num_test(self) -> int:
        """Number of held-out samples."""
        return int(self.test_x.shape[0])
