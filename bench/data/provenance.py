"""What data a run read, as the run file records it: where from, and a hash of it.

A run's ``config`` says which ``--dataset`` and ``--data-dir`` were asked for;
these attributes say what was actually read, so that two runs can be told
apart (or shown to match) by their data: two copies of Fashion-MNIST in
different folders, a re-downloaded file, a synthetic set of another size or
seed. The names are ``syncbench.analysis.schema.DATA_ATTRS``.

The hash is taken once per run, on rank 0 (every rank reads the same files),
over the files' bytes as stored, in the catalog's order: reading
Fashion-MNIST's 30 MB again costs a fraction of a second, untimed. Generated
data is hashed over its arrays, so a change to the generator shows even where
its arguments match.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from syncbench.analysis import schema
from syncbench.bench.data.dataset import Dataset, DatasetError

#: Bytes read at a time while hashing a file.
_CHUNK = 1 << 20


def data_attrs(ds: Dataset) -> dict[str, Any]:
    """The root attributes ``schema.DATA_ATTRS`` of the data in *ds* (as loaded).

    File datasets: ``data_source`` (the folder, resolved), ``data_sha256`` over the
    files of ``ds.files`` one after the other, ``data_files`` (name, bytes and SHA-256
    of each). Generated data: ``data_source`` ``"generated"``, ``data_sha256`` over
    its arrays, ``data_generator`` (``ds.generator``).

    Raises:
        DatasetError: a file read for *ds* can no longer be read (one line).
    """
    if not ds.files:
        return {schema.DATA_SOURCE_ATTR: ds.source,
                schema.DATA_SHA256_ATTR: arrays_sha256(ds),
                schema.DATA_GENERATOR_ATTR: json.dumps(ds.generator, sort_keys=True)}
    whole = hashlib.sha256()
    files = []
    for name in ds.files:
        digest, size = _hash_file(Path(name), whole)
        files.append({"name": Path(name).name, "bytes": size, "sha256": digest})
    return {schema.DATA_SOURCE_ATTR: os.path.realpath(ds.source),
            schema.DATA_SHA256_ATTR: whole.hexdigest(),
            schema.DATA_FILES_ATTR: json.dumps(files)}


def arrays_sha256(ds: Dataset) -> str:
    """SHA-256 over the arrays of *ds*: train images, train labels, test images, test
    labels, each's bytes in C order."""
    digest = hashlib.sha256()
    for array in (ds.train_x, ds.train_y, ds.test_x, ds.test_y):
        digest.update(np.ascontiguousarray(array).view(np.uint8).reshape(-1))
    return digest.hexdigest()


def _hash_file(path: Path, whole: Any) -> tuple[str, int]:
    """SHA-256 of *path* and its size; its bytes are fed to *whole* too."""
    own, size = hashlib.sha256(), 0
    try:
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                own.update(chunk)
                whole.update(chunk)
                size += len(chunk)
    except OSError as exc:
        raise DatasetError(f"{path}: cannot read file to record its hash "
                           f"({exc.strerror or exc})") from exc
    return own.hexdigest(), size
