"""What ``syncbench train --save-model PATH`` writes, and reading it back.

``PATH`` is the final consensus parameters as one flat NumPy ``.npy`` array, the
model's buffer in its own layout (:mod:`syncbench.kernels.model`); it stays a bare
array so that ``np.load(PATH)`` is the parameters, as the identity fingerprints
(``jobs/strategy_identity.py``) and the tests that compare two runs' models read it.
Beside it, ``PATH.json`` (:func:`record_path`) says what the array is: the model's
name (a ``gpt`` one with every size spelled out, ``gpt:d=64,layers=2,heads=4,ctx=128``),
the dataset, and for a text dataset the tokens (bytes), the vocabulary (256) and its
``alphabet``: the byte values that occur in the training text, each as the character
``chr(value)``, in order; with the parameter count and the SHA-256
of the array's bytes, so that a record left beside another model's array is refused
rather than believed. The ``.npy`` format is NumPy's ``numpy.lib.format`` (NEP 1).

A ``.npy`` with no record (saved before the record was written, or by another program
such as the PyTorch peers' runner) is still read: its model is then named by the caller
(``syncbench sample --model``). Every problem is a one-line :class:`SavedModelError`.
"""

from __future__ import annotations

import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from syncbench.bench.data.dataset import Dataset
from syncbench.bench.data.text import TextDataset
from syncbench.bench.files import write_atomic
from syncbench.kernels.gpt import parse_gpt_spec

#: The record's ``format`` field (a later layout changes it).
FORMAT = "syncbench-saved-model/1"
#: What a token of a text dataset is (:mod:`syncbench.bench.data.text`: bytes).
BYTE_TOKENS = "bytes"


class SavedModelError(ValueError):
    """A saved model cannot be read or does not hold what was asked; ``str()`` one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


@dataclass(frozen=True)
class SavedModel:
    """A saved model read back: its parameters and what its record says of them
    (``model`` None when there is no record and the caller named none)."""

    params: np.ndarray
    model: str | None
    dataset: str | None = None
    #: What a token is (``"bytes"``) and how many there are; None for an image model.
    tokens: str | None = None
    vocab: int | None = None
    #: The byte values that occur in the training text (None where not recorded).
    alphabet: tuple[int, ...] | None = None


def record_path(path: str | Path) -> Path:
    """The record beside saved model ``path``: ``PATH.json``."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def canonical_name(model: str) -> str:
    """``model`` with a ``gpt`` spec's every size spelled out (``gpt`` ->
    ``gpt:d=128,layers=4,heads=4,ctx=64``); any other name as it is."""
    try:
        spec = parse_gpt_spec(model)
    except ValueError as exc:
        raise SavedModelError(str(exc)) from None
    return str(spec) if spec is not None else model


def describe(model: str, data: Dataset) -> dict[str, Any]:
    """The record's fields that name the model and its tokens (not the parameters')."""
    record: dict[str, Any] = {"format": FORMAT, "model": canonical_name(model),
                              "dataset": data.name}
    if isinstance(data, TextDataset):
        counts = np.bincount(np.asarray(data.train_tokens, dtype=np.uint8),
                             minlength=data.num_classes)
        record.update(tokens=BYTE_TOKENS, vocab=int(data.num_classes),
                      alphabet="".join(map(chr, np.flatnonzero(counts))))
    return record


def digest(params: np.ndarray) -> str:
    """SHA-256 of the parameters' bytes (C order) in hex."""
    return hashlib.sha256(np.ascontiguousarray(params).tobytes()).hexdigest()


def save(path: str | Path, params: np.ndarray, record: dict[str, Any]) -> None:
    """Write ``params`` to ``path`` (``.npy``) and then ``record`` (:func:`describe`) with
    the parameter count and digest to ``PATH.json``, each whole or not at all
    (:func:`~syncbench.bench.files.write_atomic`; a failure is its one-line
    ``WriteError``)."""
    params = np.ascontiguousarray(params)
    buffer = io.BytesIO()
    np.save(buffer, params)
    write_atomic(path, buffer.getvalue())
    full = {**record, "params": int(params.size), "dtype": params.dtype.name,
            "sha256": digest(params)}
    write_atomic(record_path(path), (json.dumps(full, indent=1) + "\n").encode())


def load_params(path: str | Path) -> np.ndarray:
    """The flat float array of ``path`` (a ``.npy``); :class:`SavedModelError` otherwise."""
    try:
        with open(path, "rb") as file:
            params = np.load(file, allow_pickle=False)
    except FileNotFoundError:
        raise SavedModelError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise SavedModelError(f"{path}: is a folder, not a saved model") from None
    except OSError as exc:
        raise SavedModelError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except (ValueError, EOFError):
        raise SavedModelError(f"{path}: not a whole .npy file (what syncbench train "
                              "--save-model writes)") from None
    if not isinstance(params, np.ndarray):  # an .npz archive
        params.close()
        raise SavedModelError(f"{path}: an .npz archive, not the .npy that syncbench train "
                              "--save-model writes")
    if params.ndim != 1 or params.dtype.kind != "f":
        raise SavedModelError(f"{path}: not a flat float array (what syncbench train "
                              "--save-model writes)")
    return params


def load(path: str | Path, model: str | None = None) -> SavedModel:
    """The saved model at ``path`` and its record (``PATH.json``).

    Without a record, ``model`` names it (None: the result's ``model`` is None). With
    one, a ``model`` that names another model is refused, as is a record whose count or
    digest is not the array's."""
    params = load_params(path)
    meta = record_path(path)
    try:
        text = meta.read_text()
    except FileNotFoundError:
        return SavedModel(params, canonical_name(model) if model else None)
    except (OSError, UnicodeDecodeError) as exc:
        raise SavedModelError(f"{meta}: cannot read ({getattr(exc, 'strerror', None) or exc})"
                              ) from None
    try:
        record = json.loads(text)
        if not isinstance(record, dict) or record.get("format") != FORMAT:
            raise ValueError
        name, count, sha = str(record["model"]), int(record["params"]), str(record["sha256"])
        vocab = record.get("vocab")
        alphabet = record.get("alphabet")
        saved = SavedModel(params, name, record.get("dataset"), record.get("tokens"),
                           None if vocab is None else int(vocab),
                           None if alphabet is None else tuple(map(ord, str(alphabet))))
    except (ValueError, KeyError, TypeError):
        raise SavedModelError(f"{meta}: not a saved model's record (expected the JSON that "
                              f"syncbench train --save-model writes, format {FORMAT})"
                              ) from None
    if count != params.size or sha != digest(params):
        raise SavedModelError(f"{meta} describes other parameters than {path}'s ({count:,} "
                              f"recorded, {params.size:,} there, or their SHA-256 differs): "
                              f"was {path} replaced after it was saved?")
    if model is not None and canonical_name(model) != name:
        raise SavedModelError(f"--model {model}: {path} is {name} (its record {meta} says so)")
    return saved
