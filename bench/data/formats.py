"""The two file formats of the datasets: readers and validation.

* IDX, the format of MNIST and Fashion-MNIST (LeCun, Cortes and Burges,
  http://yann.lecun.com/exdb/mnist/): magic ``00 00 <type> <ndim>``,
  ``ndim`` big-endian 32-bit dimensions, then the big-endian payload; read
  gzipped or raw, gzip told by its magic bytes, not by the file name.
* CIFAR-10's *binary* batches (Krizhevsky, "Learning Multiple Layers of
  Features from Tiny Images", 2009; https://www.cs.toronto.edu/~kriz/cifar.html):
  3073-byte records of one label byte and 3x32x32 pixel bytes. Never the
  pickle version, which would execute code on load.

Every header, size and label is checked, and every fault is a one-line
:class:`~syncbench.bench.data.dataset.DatasetError` naming the file and,
through the ``hint`` the loaders pass, how to get a good copy.
:func:`load_idx_split` and :func:`load_cifar_split` turn the uint8 pixels
into float32 in ``[0, 1]`` with layout ``(n, C, H, W)`` exactly once,
straight into the final array; labels become int64.
"""

from __future__ import annotations

import gzip
import os
import zlib
from pathlib import Path

import numpy as np

from syncbench.bench.data.dataset import DatasetError

#: Bytes of one CIFAR-10 record: the label, then the red, green and blue 32x32 planes.
CIFAR_RECORD = 1 + 3 * 32 * 32
#: Records in each official CIFAR-10 batch file.
CIFAR_BATCH_RECORDS = 10000

# IDX type codes -> big-endian NumPy dtypes.
_IDX_DTYPES = {
    0x08: np.dtype(np.uint8),
    0x09: np.dtype(np.int8),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}

_GZIP_MAGIC = b"\x1f\x8b"

#: What to do about a bad file read outside a dataset (no package or fetch to name).
GENERIC_HINT = "replace it with a fresh copy of the official file"


def _read_bytes(path: Path, hint: str) -> bytes:
    """All bytes of *path*, gunzipped when they start with the gzip magic."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read file ({e.strerror or e}); {hint}") from e
    if data[:2] == _GZIP_MAGIC:
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error, ValueError) as e:
            raise DatasetError(f"{path}: bad gzip stream ({e}); {hint}") from e
    return data


def _parse_idx(data: bytes, path: Path, hint: str) -> np.ndarray:
    """Parse the bytes of an IDX file (already gunzipped); see :func:`read_idx`."""
    if len(data) < 4:
        raise DatasetError(
            f"{path}: not an IDX file (only {len(data)} bytes, header needs 4); {hint}"
        )
    if data[0] != 0 or data[1] != 0:
        raise DatasetError(
            f"{path}: not an IDX file (magic {data[:4].hex()} does not start with 0000); "
            + hint
        )
    code, ndim = data[2], data[3]
    dtype = _IDX_DTYPES.get(code)
    if dtype is None:
        raise DatasetError(f"{path}: unknown IDX element type 0x{code:02x}; {hint}")
    if ndim == 0:
        raise DatasetError(f"{path}: IDX header declares 0 dimensions; {hint}")
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DatasetError(
            f"{path}: truncated IDX header ({len(data)} bytes, {ndim} dimensions need "
            f"{header}); {hint}"
        )
    dims = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    count = 1
    for d in dims:
        count *= d
    expected = header + count * dtype.itemsize
    shape = "x".join(map(str, dims))
    if len(data) < expected:
        raise DatasetError(
            f"{path}: truncated IDX payload (shape {shape} needs {expected} bytes, "
            f"file has {len(data)}); {hint}"
        )
    if len(data) > expected:
        raise DatasetError(
            f"{path}: {len(data) - expected} trailing bytes after the IDX payload "
            f"(shape {shape} needs {expected} bytes); {hint}"
        )
    arr = np.frombuffer(data, dtype=dtype, count=count, offset=header).reshape(dims)
    if dtype.byteorder == ">":
        arr = arr.astype(dtype.newbyteorder("="))
    return arr


def _read_idx(path: Path, hint: str) -> np.ndarray:
    path = Path(path)
    return _parse_idx(_read_bytes(path, hint), path, hint)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzipped or raw.

    Gzip is detected by its magic bytes, not by the file name. The header is checked:
    magic ``00 00 <type> <ndim>``, a known element type (``0x08`` uint8, ``0x09`` int8,
    ``0x0B`` int16, ``0x0C`` int32, ``0x0D`` float32, ``0x0E`` float64), at least one
    dimension, and a payload of exactly the declared size.

    Returns:
        An array of the declared shape, in native byte order. For uint8 data it is a
        read-only view of the file's bytes (no copy).

    Raises:
        DatasetError: unreadable file, bad gzip stream, wrong magic or type, truncated
            header or payload, or trailing bytes; the message names the file.
    """
    return _read_idx(Path(path), GENERIC_HINT)


def _read_cifar(path: Path, hint: str) -> tuple[np.ndarray, np.ndarray]:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read file ({e.strerror or e}); {hint}") from e
    if len(data) == 0 or len(data) % CIFAR_RECORD:
        raise DatasetError(
            f"{path}: size {len(data)} bytes is not a positive multiple of the "
            f"{CIFAR_RECORD}-byte CIFAR-10 record (is it the binary version?); {hint}"
        )
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, CIFAR_RECORD)
    labels = records[:, 0]
    bad = np.flatnonzero(labels >= 10)
    if bad.size:
        raise DatasetError(
            f"{path}: label {int(labels[bad[0]])} of record {int(bad[0])} is out of range "
            f"0..9 ({bad.size} bad labels); {hint}"
        )
    images = records[:, 1:].reshape(-1, 3, 32, 32)
    return images, labels.astype(np.int64)


def read_cifar10_batch(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray]:
    """Read one CIFAR-10 binary batch (``data_batch_N.bin`` or ``test_batch.bin``).

    The file is a sequence of 3073-byte records: one label byte (0..9), then 3072 pixel
    bytes (the 32x32 red plane, then green, then blue, each row-major).

    Returns:
        ``(images, labels)``: images uint8 of shape ``(n, 3, 32, 32)`` (a read-only
        view of the file's bytes), labels int64 of shape ``(n,)``.

    Raises:
        DatasetError: unreadable file, a size that is not a positive multiple of 3073, or
            a label >= 10; the message names the file.
    """
    return _read_cifar(Path(path), GENERIC_HINT)


def _to_unit_float(parts: list[np.ndarray], sample_shape: tuple[int, ...]) -> np.ndarray:
    """Concatenate uint8 arrays into one float32 array in [0, 1], converting once."""
    n = sum(int(p.shape[0]) for p in parts)
    out = np.empty((n, *sample_shape), dtype=np.float32)
    start = 0
    for p in parts:
        stop = start + int(p.shape[0])
        np.divide(p.reshape((-1, *sample_shape)), np.float32(255.0), out=out[start:stop])
        start = stop
    return out


def load_idx_split(
    images_path: Path, labels_path: Path, classes: int, hint: str
) -> tuple[np.ndarray, np.ndarray]:
    """One split of an MNIST-layout dataset: 28x28 uint8 images and uint8 labels below
    ``classes``, as many of each, as ``(n, 1, 28, 28)`` float32 in ``[0, 1]`` and int64.

    Raises:
        DatasetError: a file the IDX reader rejects, the wrong type or shape, no images,
            mismatched counts, or a label out of range; ``hint`` ends the message.
    """
    images = _read_idx(images_path, hint)
    labels = _read_idx(labels_path, hint)
    if images.dtype != np.uint8 or images.ndim != 3:
        raise DatasetError(
            f"{images_path}: expected uint8 images of shape (n, 28, 28), got {images.dtype} "
            f"of shape {images.shape}; {hint}"
        )
    if images.shape[1:] != (28, 28):
        raise DatasetError(
            f"{images_path}: expected 28x28 images, got "
            f"{images.shape[1]}x{images.shape[2]}; {hint}"
        )
    if images.shape[0] == 0:
        raise DatasetError(f"{images_path}: holds no images; {hint}")
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise DatasetError(
            f"{labels_path}: expected uint8 labels of shape (n,), got {labels.dtype} of "
            f"shape {labels.shape}; {hint}"
        )
    if labels.shape[0] != images.shape[0]:
        raise DatasetError(
            f"{labels_path}: holds {labels.shape[0]} labels but {images_path.name} holds "
            f"{images.shape[0]} images; {hint}"
        )
    bad = np.flatnonzero(labels >= classes)
    if bad.size:
        raise DatasetError(
            f"{labels_path}: label {int(labels[bad[0]])} at index {int(bad[0])} is out of "
            f"range 0..{classes - 1} ({bad.size} bad labels); {hint}"
        )
    return _to_unit_float([images], (1, 28, 28)), labels.astype(np.int64)


def load_cifar_split(paths: list[Path], hint: str) -> tuple[np.ndarray, np.ndarray]:
    """The CIFAR-10 binary batches at ``paths`` as one ``(n, 3, 32, 32)`` float32 array in
    ``[0, 1]`` and int64 labels (``hint`` ends any error message)."""
    batches = [_read_cifar(p, hint) for p in paths]
    x = _to_unit_float([b[0] for b in batches], (3, 32, 32))
    y = np.concatenate([b[1] for b in batches])
    return x, y
