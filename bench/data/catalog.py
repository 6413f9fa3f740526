"""Datasets for syncbench: find, validate and load them; fetch them where there is internet.

The benchmark trains small models on four datasets:

* ``fashion-mnist`` and ``mnist``: the IDX files (gzipped or raw), 28x28 grey images,
  10 classes;
* ``cifar10``: the *binary* batches (never the pickle version, which would execute
  code on load), 3x32x32 colour images, 10 classes;
* ``synthetic``: generated on the fly, any size and shape, deterministic for a seed and
  learnable, for scaling studies that must not depend on files.

Files are looked up in ``--data-dir``, then ``$SYNCBENCH_DATA``, then
``/usr/share/datasets/<name>`` (where Debian's ``dataset-fashion-mnist`` package puts
Fashion-MNIST). Benchmarks run unattended on clusters, so every way a file can be
missing or corrupt ends in a :class:`DatasetError` whose message is one line naming the
file, what is wrong with it, and how to get a good copy, instead of a traceback from deep
inside NumPy halfway through an MPI job.

Loaded images are float32 in ``[0, 1]`` with layout ``(n, C, H, W)`` and labels int64; the
uint8 pixels are converted exactly once, straight into the final array.
:func:`fetch_dataset` downloads the official files with :mod:`urllib` and verifies their
MD5 checksums. What the code knows about each file dataset (files, layout, classes,
mirrors, checksums, aliases, system package) is one :class:`DatasetSpec` entry of
:data:`CATALOG`.
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import os
import sys
import tarfile
import urllib.error
import urllib.request
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = [
    "CATALOG",
    "DATASETS",
    "DatasetSpec",
    "SYSTEM_DATA_ROOT",
    "Dataset",
    "DatasetError",
    "fetch_dataset",
    "file_md5",
    "find_dataset_dir",
    "load_dataset",
    "make_synthetic",
    "read_cifar10_batch",
    "read_idx",
    "verify_md5",
]

#: Where system packages install datasets (one folder per dataset name). Module-level
#: so that tests can point it elsewhere.
SYSTEM_DATA_ROOT = Path("/usr/share/datasets")

#: Environment variable naming extra data roots (``os.pathsep``-separated).
DATA_ENV = "SYNCBENCH_DATA"

# --- file layouts --------------------------------------------------------------------

_IDX_TRAIN_IMAGES = "train-images-idx3-ubyte"
_IDX_TRAIN_LABELS = "train-labels-idx1-ubyte"
_IDX_TEST_IMAGES = "t10k-images-idx3-ubyte"
_IDX_TEST_LABELS = "t10k-labels-idx1-ubyte"
_IDX_FILES = (_IDX_TRAIN_IMAGES, _IDX_TRAIN_LABELS, _IDX_TEST_IMAGES, _IDX_TEST_LABELS)

_CIFAR_TRAIN = tuple(f"data_batch_{i}.bin" for i in range(1, 6))
_CIFAR_TEST = "test_batch.bin"
_CIFAR_FILES = (*_CIFAR_TRAIN, _CIFAR_TEST)
_CIFAR_SUBDIR = "cifar-10-batches-bin"
_CIFAR_RECORD = 1 + 3 * 32 * 32
_CIFAR_BATCH_RECORDS = 10000


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

# --- official files and checksums (for fetch_dataset) --------------------------------

_FASHION_MIRRORS = (
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
)
_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
_CIFAR_TARBALL = "cifar-10-binary.tar.gz"

#: MD5 of every official download, by dataset and file name.
OFFICIAL_MD5: dict[str, dict[str, str]] = {
    "fashion-mnist": {
        "train-images-idx3-ubyte.gz": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte.gz": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte.gz": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte.gz": "bb300cfdad3c16e7a12a480ee83cd310",
    },
    "mnist": {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c",
    },
    "cifar10": {_CIFAR_TARBALL: "c32a1d4ab5d03f1284b67883e8d87530"},
}


@dataclass(frozen=True)
class DatasetSpec:
    """Everything the code knows about one file dataset: a new dataset is one entry.

    ``layout`` picks the reader and loader (``idx``: four IDX files, gzipped
    or raw; ``cifar``: CIFAR-10's binary batches). ``mirrors`` are base URLs
    tried in order for every official download named in ``md5``;
    ``subdirs`` are folders under a root where the files may also sit;
    ``package`` is the system package that installs it under
    :data:`SYSTEM_DATA_ROOT` ("" when none).
    """

    name: str
    classes: int
    layout: str
    files: tuple[str, ...]
    mirrors: tuple[str, ...]
    md5: dict[str, str]
    subdirs: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    package: str = ""


#: The file datasets by name (``synthetic`` is generated and has no entry).
CATALOG: dict[str, DatasetSpec] = {spec.name: spec for spec in (
    DatasetSpec("fashion-mnist", 10, "idx", _IDX_FILES, _FASHION_MIRRORS,
                OFFICIAL_MD5["fashion-mnist"], aliases=("fashionmnist",),
                package="dataset-fashion-mnist"),
    DatasetSpec("mnist", 10, "idx", _IDX_FILES, _MNIST_MIRRORS, OFFICIAL_MD5["mnist"]),
    DatasetSpec("cifar10", 10, "cifar", _CIFAR_FILES, (_CIFAR_URL.rsplit("/", 1)[0] + "/",),
                OFFICIAL_MD5["cifar10"], subdirs=(_CIFAR_SUBDIR,), aliases=("cifar-10",)),
)}

#: Dataset names (``--dataset``): the file datasets of :data:`CATALOG`, then ``synthetic``.
DATASETS = (*CATALOG, "synthetic")


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
    the directory the files came from, or ``"generated"``.
    """

    name: str
    train_x: np.ndarray = field(repr=False)
    train_y: np.ndarray = field(repr=False)
    test_x: np.ndarray = field(repr=False)
    test_y: np.ndarray = field(repr=False)
    num_classes: int
    source: str

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


# --- how to get a dataset ------------------------------------------------------------


def _how_to_get(name: str) -> str:
    """One clause telling the user how to obtain dataset *name*."""
    fetch = f"`syncbench data fetch {name} --dest DIR` (needs internet)"
    point = f"pass --data-dir DIR or set ${DATA_ENV}"
    package = CATALOG[name].package
    if package:
        return (f"install it with `apt-get install {package}`, "
                f"or download it with {fetch} and {point}")
    return f"download it with {fetch} and {point}"


def _redownload_hint(name: str) -> str:
    """One clause telling the user how to replace a corrupt file of dataset *name*."""
    package = CATALOG[name].package
    if package:
        return (f"reinstall it (`apt-get install --reinstall {package}`) or "
                f"re-download it with `syncbench data fetch {name}`")
    return f"re-download it with `syncbench data fetch {name}`"


_GENERIC_HINT = "replace it with a fresh copy of the official file"


def _canonical_name(name: str) -> str:
    """Normalize a dataset name (case, ``_`` for ``-``) or raise for an unknown one."""
    canon = str(name).strip().lower().replace("_", "-")
    canon = next((s.name for s in CATALOG.values() if canon in s.aliases), canon)
    if canon not in DATASETS:
        raise DatasetError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    return canon


# --- locating files ------------------------------------------------------------------


def _required(name: str) -> tuple[str, ...]:
    """Base names of the files dataset *name* needs."""
    return CATALOG[name].files


def _find_file(directory: Path, base: str) -> Path | None:
    """The file *base* in *directory*; IDX files may also carry a ``.gz`` suffix.

    A raw file is preferred over its gzipped twin (it reads faster).
    """
    candidates = [base] if base.endswith(".bin") else [base, base + ".gz"]
    for cand in candidates:
        path = directory / cand
        if path.is_file():
            return path
    return None


def _candidate_dirs(name: str, data_dir: str | os.PathLike | None) -> list[Path]:
    """Directories to search for dataset *name*, in look-up order."""
    roots: list[Path] = []
    if data_dir is not None and str(data_dir) != "":
        roots.append(Path(data_dir).expanduser())
    env = os.environ.get(DATA_ENV, "")
    roots.extend(Path(p).expanduser() for p in env.split(os.pathsep) if p)

    dirs: list[Path] = []
    for root in roots:
        dirs.append(root / name)
        subdirs = CATALOG[name].subdirs
        dirs.extend(root / name / sub for sub in subdirs)
        dirs.extend(root / sub for sub in subdirs)
        dirs.append(root)
    system = Path(SYSTEM_DATA_ROOT) / name
    dirs.append(system)
    dirs.extend(system / sub for sub in CATALOG[name].subdirs)
    # Drop duplicates, keep order.
    seen: set[Path] = set()
    unique = []
    for d in dirs:
        if d not in seen:
            seen.add(d)
            unique.append(d)
    return unique


def find_dataset_dir(name: str, data_dir: str | os.PathLike | None = None) -> Path:
    """Find the directory holding the files of dataset *name*.

    Roots are searched in order: *data_dir* (``--data-dir``), each entry of
    ``$SYNCBENCH_DATA`` (``os.pathsep``-separated), then ``/usr/share/datasets``. In a
    user root the files may sit in ``<root>/<name>`` or directly in ``<root>`` (for
    ``cifar10`` also in ``<root>/cifar-10-batches-bin``); in the system root only
    ``/usr/share/datasets/<name>`` is used. The first directory holding the complete set
    wins. A directory holding only part of the set is an error (naming the missing
    files) rather than being skipped silently.

    Raises:
        DatasetError: unknown name, ``synthetic`` (it has no files), an incomplete
            directory, or nothing found (the message lists where it looked).
    """
    name = _canonical_name(name)
    if name == "synthetic":
        raise DatasetError("dataset 'synthetic' is generated and has no files or directory")
    required = _required(name)
    looked: list[str] = []
    for d in _candidate_dirs(name, data_dir):
        looked.append(str(d))
        if not d.is_dir():
            continue
        missing = [base for base in required if _find_file(d, base) is None]
        if not missing:
            return d
        if len(missing) < len(required):
            raise DatasetError(
                f"dataset {name!r} in {d} is incomplete: missing {', '.join(missing)}; "
                + _how_to_get(name)
            )
    raise DatasetError(
        f"dataset {name!r} not found (looked in: {', '.join(looked)}); " + _how_to_get(name)
    )


# --- readers -------------------------------------------------------------------------


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
    return _read_idx(Path(path), _GENERIC_HINT)


def _read_cifar(path: Path, hint: str) -> tuple[np.ndarray, np.ndarray]:
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DatasetError(f"{path}: cannot read file ({e.strerror or e}); {hint}") from e
    if len(data) == 0 or len(data) % _CIFAR_RECORD:
        raise DatasetError(
            f"{path}: size {len(data)} bytes is not a positive multiple of the "
            f"{_CIFAR_RECORD}-byte CIFAR-10 record (is it the binary version?); {hint}"
        )
    records = np.frombuffer(data, dtype=np.uint8).reshape(-1, _CIFAR_RECORD)
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
    return _read_cifar(Path(path), _GENERIC_HINT)


# --- loading -------------------------------------------------------------------------


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


def _load_idx_split(
    name: str, images_path: Path, labels_path: Path
) -> tuple[np.ndarray, np.ndarray]:
    hint = _redownload_hint(name)
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
    bad = np.flatnonzero(labels >= CATALOG[name].classes)
    if bad.size:
        raise DatasetError(
            f"{labels_path}: label {int(labels[bad[0]])} at index {int(bad[0])} is out of "
            f"range 0..{CATALOG[name].classes - 1} ({bad.size} bad labels); {hint}"
        )
    return _to_unit_float([images], (1, 28, 28)), labels.astype(np.int64)


def _load_cifar_split(name: str, paths: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    hint = _redownload_hint(name)
    batches = [_read_cifar(p, hint) for p in paths]
    x = _to_unit_float([b[0] for b in batches], (3, 32, 32))
    y = np.concatenate([b[1] for b in batches])
    return x, y


def load_dataset(
    name: str,
    data_dir: str | os.PathLike | None = None,
    *,
    synthetic_train: int = 8192,
    synthetic_test: int = 2048,
    synthetic_shape: tuple[int, int, int] = (1, 28, 28),
    synthetic_classes: int = 10,
    seed: int = 0,
) -> Dataset:
    """Load dataset *name* (one of :data:`DATASETS`) with its train and test splits.

    File datasets are located with :func:`find_dataset_dir` and fully validated: for
    ``mnist``/``fashion-mnist`` the four IDX files (gzipped or raw; 28x28 uint8 images,
    labels < 10, matching counts; any number of samples), for ``cifar10`` the five
    ``data_batch_N.bin`` files (train) and ``test_batch.bin`` (test). ``synthetic`` is
    generated by :func:`make_synthetic` from the ``synthetic_*`` arguments and *seed*
    (*data_dir* is ignored); *seed* does not affect file datasets.

    Raises:
        DatasetError: unknown name, files missing or corrupt (one line naming the file
            and how to get it).
    """
    name = _canonical_name(name)
    if name == "synthetic":
        return make_synthetic(
            synthetic_train, synthetic_test, synthetic_shape, synthetic_classes, seed
        )
    directory = find_dataset_dir(name, data_dir)
    files = {}
    for base in _required(name):
        path = _find_file(directory, base)
        if path is None:  # removed between look-up and load
            raise DatasetError(f"{directory / base}: file not found; {_how_to_get(name)}")
        files[base] = path
    if CATALOG[name].layout == "cifar":
        train_x, train_y = _load_cifar_split(name, [files[b] for b in _CIFAR_TRAIN])
        test_x, test_y = _load_cifar_split(name, [files[_CIFAR_TEST]])
    else:
        train_x, train_y = _load_idx_split(
            name, files[_IDX_TRAIN_IMAGES], files[_IDX_TRAIN_LABELS]
        )
        test_x, test_y = _load_idx_split(name, files[_IDX_TEST_IMAGES], files[_IDX_TEST_LABELS])
    return Dataset(
        name=name,
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=CATALOG[name].classes,
        source=str(directory),
    )


# --- synthetic -----------------------------------------------------------------------

_SYN_BLOBS = 4  # Gaussian blobs per class prototype and channel
_SYN_NOISE = 0.3  # pixel noise standard deviation
_SYN_MIX = 0.4  # largest weight of another class's prototype blended into a sample


def _prototypes(
    rng: np.random.Generator, classes: int, shape: tuple[int, int, int]
) -> np.ndarray:
    """One smooth image per class: a sum of random Gaussian blobs per channel, max 1."""
    c, h, w = shape
    yy = ((np.arange(h, dtype=np.float32) + 0.5) / h)[:, None]
    xx = ((np.arange(w, dtype=np.float32) + 0.5) / w)[None, :]
    protos = np.zeros((classes, c, h, w), dtype=np.float32)
    for k in range(classes):
        for ch in range(c):
            img = np.zeros((h, w), dtype=np.float32)
            for _ in range(_SYN_BLOBS):
                cy, cx = rng.uniform(0.15, 0.85, size=2)
                sigma = rng.uniform(0.08, 0.22)
                amp = rng.uniform(0.5, 1.0)
                img += np.float32(amp) * np.exp(
                    -((yy - cy) ** 2 + (xx - cx) ** 2) / np.float32(2 * sigma * sigma)
                ).astype(np.float32)
            protos[k, ch] = img / max(float(img.max()), 1e-6)
    return protos


def _synthetic_split(
    rng: np.random.Generator, protos: np.ndarray, n: int
) -> tuple[np.ndarray, np.ndarray]:
    classes = protos.shape[0]
    y = rng.integers(0, classes, size=n)
    other = (y + rng.integers(1, classes, size=n)) % classes
    mix = rng.uniform(0.0, _SYN_MIX, size=n).astype(np.float32)[:, None, None, None]
    contrast = rng.uniform(0.6, 1.0, size=n).astype(np.float32)[:, None, None, None]
    x = rng.standard_normal((n, *protos.shape[1:]), dtype=np.float32)
    x *= np.float32(_SYN_NOISE)
    x += contrast * ((1 - mix) * protos[y] + mix * protos[other])
    np.clip(x, 0.0, 1.0, out=x)
    return x, y.astype(np.int64)


def make_synthetic(
    n_train: int,
    n_test: int,
    shape: tuple[int, int, int] = (1, 28, 28),
    classes: int = 10,
    seed: int = 0,
) -> Dataset:
    """Generate a deterministic, learnable classification dataset.

    Each class has a smooth prototype image (a few Gaussian blobs per channel). A sample
    is its class prototype blended with up to 40% of another class's prototype, scaled
    by a random contrast, plus Gaussian pixel noise, clipped to ``[0, 1]``. Plain softmax
    regression (300 SGD steps) reaches 95-99% test accuracy on the default size, well
    above chance but not perfectly separable, so training curves mean something without
    any files. The same arguments always give identical arrays (train and test come from
    one generator, so sizes are part of what must match).

    Raises:
        DatasetError: a non-positive size, a shape that is not three positive integers,
            or fewer than two classes.
    """
    try:
        dims = tuple(int(s) for s in shape)
    except (TypeError, ValueError) as e:
        raise DatasetError(f"synthetic dataset: bad shape {shape!r} ({e})") from e
    if len(dims) != 3 or min(dims) < 1:
        raise DatasetError(
            f"synthetic dataset: shape must be three positive integers (C, H, W), got {shape!r}"
        )
    if int(n_train) < 1 or int(n_test) < 1:
        raise DatasetError(
            f"synthetic dataset: sizes must be >= 1, got train={n_train} test={n_test}"
        )
    if int(classes) < 2:
        raise DatasetError(f"synthetic dataset: needs at least 2 classes, got {classes}")
    c, h, w = dims
    rng = np.random.default_rng(seed)
    protos = _prototypes(rng, int(classes), (c, h, w))
    train_x, train_y = _synthetic_split(rng, protos, int(n_train))
    test_x, test_y = _synthetic_split(rng, protos, int(n_test))
    return Dataset(
        name="synthetic",
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=int(classes),
        source="generated",
    )


# --- checksums and fetching ----------------------------------------------------------


def file_md5(path: str | os.PathLike) -> str:
    """Hex MD5 digest of the file at *path* (read in 1 MiB blocks)."""
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_md5(path: str | os.PathLike, expected: str) -> None:
    """Check that the file at *path* has MD5 *expected* (hex, any case).

    Raises:
        DatasetError: the file cannot be read or its checksum differs.
    """
    path = Path(path)
    try:
        actual = file_md5(path)
    except OSError as e:
        raise DatasetError(f"{path}: cannot read file for checksum ({e.strerror or e})") from e
    if actual != expected.strip().lower():
        raise DatasetError(
            f"{path}: MD5 checksum mismatch (expected {expected.lower()}, got {actual}); "
            "the download is corrupt or not the official file, delete it and fetch again"
        )


def _progress(msg: str, *, final: bool = False) -> None:
    """Write a progress message to stderr (overwriting the line on a terminal)."""
    if sys.stderr.isatty():
        sys.stderr.write("\r" + msg + ("\n" if final else ""))
    elif final:
        sys.stderr.write(msg + "\n")
    sys.stderr.flush()


def _download(url: str, target: Path, expected_md5: str, timeout: float = 60.0) -> None:
    """Download *url* to *target* via a ``.part`` file, verifying its MD5 on the way.

    Raises:
        DatasetError: network failure or checksum mismatch (no partial file is left).
    """
    part = target.with_name(target.name + ".part")
    h = hashlib.md5(usedforsecurity=False)
    done = 0
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0)
            next_report = 0
            while True:
                block = resp.read(1 << 16)
                if not block:
                    break
                out.write(block)
                h.update(block)
                done += len(block)
                if done >= next_report:
                    pct = f" {100 * done // total:3d}%" if total else ""
                    _progress(f"  {target.name}:{pct} {done / 1e6:.1f} MB")
                    next_report = done + (1 << 20)
            if total and done != total:
                raise DatasetError(
                    f"{url}: download incomplete ({done} of {total} bytes); check the network"
                )
    except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
        part.unlink(missing_ok=True)
        reason = getattr(e, "reason", None) or e
        raise DatasetError(f"{url}: download failed ({reason}); check the network") from e
    except DatasetError:
        part.unlink(missing_ok=True)
        raise
    _progress(f"  {target.name}: {done / 1e6:.1f} MB", final=True)
    if h.hexdigest() != expected_md5:
        part.unlink(missing_ok=True)
        raise DatasetError(
            f"{url}: MD5 checksum mismatch (expected {expected_md5}, got {h.hexdigest()}); "
            "the server sent a different file"
        )
    part.replace(target)


def _fetch_file(mirrors: tuple[str, ...], filename: str, dest: Path, md5: str) -> Path:
    """Get *filename* from the first mirror that delivers it with the right checksum."""
    target = dest / filename
    if target.is_file():
        try:
            verify_md5(target, md5)
            print(f"  {filename}: already present, checksum ok", file=sys.stderr)
            return target
        except DatasetError:
            print(f"  {filename}: present but checksum differs, downloading", file=sys.stderr)
    errors = []
    for base in mirrors:
        url = base + filename
        print(f"  {filename}: {url}", file=sys.stderr)
        try:
            _download(url, target, md5)
            return target
        except DatasetError as e:
            errors.append(str(e))
            print(f"  {e}", file=sys.stderr)
    raise DatasetError(f"{filename}: every mirror failed: {' | '.join(errors)}")


def _extract_cifar(tarball: Path, dest: Path) -> list[Path]:
    """Extract the six binary batches from the official tarball into *dest* (flat)."""
    wanted = set(_CIFAR_FILES) | {"batches.meta.txt"}
    written: dict[str, Path] = {}
    try:
        with tarfile.open(tarball, "r:gz") as tar:
            for member in tar:
                base = member.name.rsplit("/", 1)[-1]
                if base not in wanted or not member.isfile():
                    continue
                src = tar.extractfile(member)
                if src is None:
                    continue
                out_path = dest / base
                with src, open(out_path, "wb") as out:
                    while block := src.read(1 << 20):
                        out.write(block)
                written[base] = out_path
    except (tarfile.TarError, OSError, EOFError, zlib.error) as e:
        raise DatasetError(
            f"{tarball}: cannot extract ({e}); delete it and run "
            "`syncbench data fetch cifar10` again"
        ) from e
    missing = [f for f in _CIFAR_FILES if f not in written]
    if missing:
        raise DatasetError(
            f"{tarball}: archive lacks {', '.join(missing)}; delete it and fetch again"
        )
    return [written[f] for f in _CIFAR_FILES]


def fetch_dataset(name: str, dest: str | os.PathLike) -> list[Path]:
    """Download the official files of dataset *name* into directory *dest*.

    ``fashion-mnist`` comes from Zalando's GitHub repository (S3 as fallback), ``mnist``
    from the PyTorch S3 mirror (Google's CVDF mirror as fallback), ``cifar10`` as the
    binary tarball from cs.toronto.edu, of which the six ``.bin`` batches are extracted
    flat into *dest* (the tarball is removed afterwards). Every download is checked
    against the official MD5; files already present with the right checksum are not
    downloaded again. Progress goes to stderr. Afterwards ``--data-dir DEST`` finds the
    dataset. ``synthetic`` has nothing to fetch and returns ``[]``.

    Returns:
        The paths of the dataset files in *dest*.

    Raises:
        DatasetError: unknown name, *dest* not writable, network failure on every
            mirror, or checksum mismatch.
    """
    name = _canonical_name(name)
    if name == "synthetic":
        print("synthetic: generated on the fly, nothing to fetch", file=sys.stderr)
        return []
    dest = Path(dest).expanduser()
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DatasetError(f"{dest}: cannot create directory ({e.strerror or e})") from e
    print(f"fetching {name} into {dest}", file=sys.stderr)
    spec = CATALOG[name]
    if spec.layout == "cifar":
        existing = [dest / f for f in spec.files]
        expected_size = _CIFAR_BATCH_RECORDS * _CIFAR_RECORD
        if all(p.is_file() and p.stat().st_size == expected_size for p in existing):
            print("  binary batches already present", file=sys.stderr)
            return existing
        tarball = _fetch_file(spec.mirrors, _CIFAR_TARBALL, dest, spec.md5[_CIFAR_TARBALL])
        paths = _extract_cifar(tarball, dest)
        tarball.unlink(missing_ok=True)
        return paths
    return [_fetch_file(spec.mirrors, filename, dest, md5) for filename, md5 in spec.md5.items()]
