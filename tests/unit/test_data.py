"""Datasets: IDX/CIFAR readers and validation, look-up, loading, synthetic data, fetching.

Split off this module: ``tests/e2e/test_data_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import struct
import tarfile
from pathlib import Path

import numpy as np
import pytest

from syncbench.bench.data import catalog, fetch, formats
from syncbench.bench.data.dataset import DatasetError

SYSTEM_FMNIST = Path("/usr/share/datasets/fashion-mnist")

IDX_NAMES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
CIFAR_NAMES = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]


# --- helpers -------------------------------------------------------------------------


def idx_bytes(arr: np.ndarray) -> bytes:
    """Encode *arr* in the IDX format (big-endian payload)."""
    codes = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C,
             np.float32: 0x0D, np.float64: 0x0E}
    code = codes[arr.dtype.type]
    header = bytes([0, 0, code, arr.ndim]) + b"".join(struct.pack(">I", d) for d in arr.shape)
    return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def write_idx(path: Path, arr: np.ndarray, gz: bool) -> Path:
    raw = idx_bytes(arr)
    path.write_bytes(gzip.compress(raw) if gz else raw)
    return path


def make_mnist_dir(
    directory: Path, n_train: int = 12, n_test: int = 5, gz: bool = True, seed: int = 0
) -> dict[str, np.ndarray]:
    """Write a small but valid MNIST-layout dataset; return the arrays written."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {
        "train_images": rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8),
        "train_labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "test_images": rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8),
        "test_labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    suffix = ".gz" if gz else ""
    for key, arr in arrays.items():
        write_idx(directory / (IDX_NAMES[key] + suffix), arr, gz)
    return arrays


def cifar_bytes(images: np.ndarray, labels: np.ndarray) -> bytes:
    records = np.concatenate(
        [labels.astype(np.uint8)[:, None], images.reshape(len(images), -1)], axis=1
    )
    return records.astype(np.uint8).tobytes()


def make_cifar_dir(directory: Path, per_batch: int = 3, seed: int = 0):
    """Write six small binary batches; return (train images, train labels, test ...)."""
    rng = np.random.default_rng(seed)
    directory.mkdir(parents=True, exist_ok=True)
    imgs, labs = [], []
    for fname in CIFAR_NAMES:
        x = rng.integers(0, 256, (per_batch, 3, 32, 32), dtype=np.uint8)
        y = rng.integers(0, 10, per_batch, dtype=np.uint8)
        (directory / fname).write_bytes(cifar_bytes(x, y))
        imgs.append(x)
        labs.append(y)
    return (np.concatenate(imgs[:5]), np.concatenate(labs[:5]), imgs[5], labs[5])


def assert_one_line_error(exc: pytest.ExceptionInfo, *needles: str) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and "\r" not in msg, msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    return msg


@pytest.fixture(autouse=True)
def isolated_lookup(monkeypatch, tmp_path):
    """No $SYNCBENCH_DATA and an empty system root unless a test sets them."""
    monkeypatch.delenv("SYNCBENCH_DATA", raising=False)
    empty = tmp_path / "system-root"
    empty.mkdir()
    monkeypatch.setattr(catalog, "SYSTEM_DATA_ROOT", empty)


# --- real Fashion-MNIST --------------------------------------------------------------


@pytest.mark.skipif(
    not SYSTEM_FMNIST.is_dir(),
    reason=f"{SYSTEM_FMNIST} absent (apt-get install dataset-fashion-mnist)",
)
def test_real_fashion_mnist(monkeypatch):
    monkeypatch.setattr(catalog, "SYSTEM_DATA_ROOT", SYSTEM_FMNIST.parent)
    ds = catalog.load_dataset("fashion-mnist")
    assert ds.name == "fashion-mnist"
    assert ds.source == str(SYSTEM_FMNIST)
    assert ds.train_x.shape == (60000, 1, 28, 28)
    assert ds.test_x.shape == (10000, 1, 28, 28)
    assert ds.train_y.shape == (60000,) and ds.test_y.shape == (10000,)
    assert ds.train_x.dtype == np.float32 and ds.test_x.dtype == np.float32
    assert ds.train_y.dtype == np.int64 and ds.test_y.dtype == np.int64
    assert ds.input_shape == (1, 28, 28) and ds.num_classes == 10
    for x in (ds.train_x, ds.test_x):
        assert float(x.min()) == 0.0 and float(x.max()) == 1.0
    for y in (ds.train_y, ds.test_y):
        assert y.min() == 0 and y.max() == 9
    # Fashion-MNIST is exactly balanced.
    assert np.all(np.bincount(ds.train_y, minlength=10) == 6000)
    assert np.all(np.bincount(ds.test_y, minlength=10) == 1000)


# --- IDX reader ----------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize(
    "arr",
    [
        np.arange(7 * 28 * 28, dtype=np.int64).astype(np.uint8).reshape(7, 28, 28),
        np.array([0, 9, 3, 255], dtype=np.uint8),
        np.arange(24, dtype=np.int16).reshape(2, 3, 4) - 7,
        np.arange(6, dtype=np.int32).reshape(3, 2) * -100000,
        np.linspace(-1, 1, 10, dtype=np.float32),
        np.linspace(-1, 1, 10, dtype=np.float64).reshape(2, 5),
        np.arange(-5, 5, dtype=np.int8),
        np.zeros((0, 28, 28), dtype=np.uint8),
    ],
    ids=["u8-3d", "u8-1d", "i16", "i32", "f32", "f64", "i8", "empty"],
)
def test_idx_round_trip(tmp_path, arr, gz):
    path = write_idx(tmp_path / ("x.idx" + (".gz" if gz else "")), arr, gz)
    back = formats.read_idx(path)
    assert back.shape == arr.shape
    assert back.dtype == arr.dtype  # native byte order, same kind
    np.testing.assert_array_equal(back, arr)


def test_idx_gzip_detected_by_magic_not_suffix(tmp_path):
    arr = np.arange(10, dtype=np.uint8)
    gz_named_raw = write_idx(tmp_path / "labels.gz", arr, gz=False)
    raw_named_gz = tmp_path / "labels"
    raw_named_gz.write_bytes(gzip.compress(idx_bytes(arr)))
    np.testing.assert_array_equal(formats.read_idx(gz_named_raw), arr)
    np.testing.assert_array_equal(formats.read_idx(raw_named_gz), arr)


GOOD = np.arange(2 * 28 * 28, dtype=np.int64).astype(np.uint8).reshape(2, 28, 28)


@pytest.mark.parametrize(
    "blob, needle",
    [
        (b"\x01\x00\x08\x03" + idx_bytes(GOOD)[4:], "not an IDX file"),
        (b"\x00\x00\x42\x03" + idx_bytes(GOOD)[4:], "element type"),
        (b"\x00\x00\x08\x00", "0 dimensions"),
        (idx_bytes(GOOD)[:10], "truncated IDX header"),
        (idx_bytes(GOOD)[:-1], "truncated IDX payload"),
        (idx_bytes(GOOD) + b"\x00\x00\x00", "trailing bytes"),
        (b"\x00\x00", "not an IDX file"),
        (b"", "not an IDX file"),
        (gzip.compress(idx_bytes(GOOD))[:-20], "bad gzip"),
        (b"\x1f\x8b\x08\x00garbage that is not deflate", "bad gzip"),
        (gzip.compress(idx_bytes(GOOD)) + b"junk after the member", "bad gzip"),
        (gzip.compress(idx_bytes(GOOD)[:-5]), "truncated IDX payload"),
    ],
    ids=["magic", "type", "ndim0", "header", "payload", "trailing", "short", "empty",
         "gz-truncated", "gz-garbage", "gz-trailing", "gz-payload"],
)
def test_idx_corruption(tmp_path, blob, needle):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    path.write_bytes(blob)
    with pytest.raises(DatasetError) as exc:
        formats.read_idx(path)
    assert_one_line_error(exc, str(path), needle)


def test_idx_missing_file(tmp_path):
    with pytest.raises(DatasetError) as exc:
        formats.read_idx(tmp_path / "nope-idx1-ubyte")
    assert_one_line_error(exc, "nope-idx1-ubyte", "cannot read")


# --- MNIST-layout loading ------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_load_mnist_from_data_dir(tmp_path, gz):
    arrays = make_mnist_dir(tmp_path / "mine", gz=gz)
    ds = catalog.load_dataset("mnist", tmp_path / "mine")
    assert ds.source == str(tmp_path / "mine")
    assert ds.train_x.shape == (12, 1, 28, 28) and ds.test_x.shape == (5, 1, 28, 28)
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int64
    assert ds.train_x.flags.c_contiguous and ds.train_x.flags.writeable
    np.testing.assert_array_equal(
        np.rint(ds.train_x[:, 0] * 255).astype(np.uint8), arrays["train_images"]
    )
    np.testing.assert_array_equal(
        np.rint(ds.test_x[:, 0] * 255).astype(np.uint8), arrays["test_images"]
    )
    np.testing.assert_array_equal(ds.train_y, arrays["train_labels"])
    np.testing.assert_array_equal(ds.test_y, arrays["test_labels"])
    assert ds.train_x.min() >= 0.0 and ds.train_x.max() <= 1.0


def test_load_mixed_gz_and_raw_and_subdir(tmp_path):
    root = tmp_path / "root"
    arrays = make_mnist_dir(root / "fashion-mnist", gz=True)
    # Replace one file by its raw twin: both kinds are accepted together.
    gz_file = root / "fashion-mnist" / (IDX_NAMES["test_labels"] + ".gz")
    gz_file.unlink()
    write_idx(root / "fashion-mnist" / IDX_NAMES["test_labels"], arrays["test_labels"], False)
    ds = catalog.load_dataset("fashion-mnist", root)
    assert ds.source == str(root / "fashion-mnist")
    np.testing.assert_array_equal(ds.test_y, arrays["test_labels"])


def test_env_var_respected_and_data_dir_wins(tmp_path, monkeypatch):
    env_root = tmp_path / "env"
    make_mnist_dir(env_root / "mnist", n_train=4)
    monkeypatch.setenv("SYNCBENCH_DATA", str(env_root))
    ds = catalog.load_dataset("mnist")
    assert ds.source == str(env_root / "mnist") and ds.train_x.shape[0] == 4
    assert catalog.find_dataset_dir("mnist") == env_root / "mnist"

    make_mnist_dir(tmp_path / "explicit", n_train=6)
    ds = catalog.load_dataset("mnist", tmp_path / "explicit")
    assert ds.source == str(tmp_path / "explicit") and ds.train_x.shape[0] == 6

    # A --data-dir without the dataset is an error: no silent fall-back to $SYNCBENCH_DATA.
    (tmp_path / "empty").mkdir()
    with pytest.raises(DatasetError) as exc:
        catalog.find_dataset_dir("mnist", tmp_path / "empty")
    msg = assert_one_line_error(exc, "not found in --data-dir", str(tmp_path / "empty"))
    assert str(env_root) not in msg


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist", "cifar10"])
def test_missing_dataset(tmp_path, monkeypatch, name):
    monkeypatch.setenv("SYNCBENCH_DATA", str(tmp_path / "envroot"))
    with pytest.raises(DatasetError) as exc:
        catalog.load_dataset(name)
    msg = assert_one_line_error(
        exc, name, "not found", str(tmp_path / "envroot"),
        f"syncbench data fetch {name}", "--data-dir", "SYNCBENCH_DATA",
    )
    if name == "fashion-mnist":
        assert "apt-get install dataset-fashion-mnist" in msg


@pytest.mark.parametrize("name", ["mnist", "fashion-mnist", "cifar10", "synthetic"])
def test_a_data_dir_that_does_not_exist_is_an_error(tmp_path, monkeypatch, name):
    """An explicit --data-dir is where the data must be: one that does not exist is an
    error even where another copy would be found ($SYNCBENCH_DATA, the system folder)."""
    make_mnist_dir(tmp_path / "env" / "mnist")
    make_mnist_dir(tmp_path / "env" / "fashion-mnist")
    monkeypatch.setenv("SYNCBENCH_DATA", str(tmp_path / "env"))
    with pytest.raises(DatasetError) as exc:
        catalog.load_dataset(name, tmp_path / "nowhere")
    assert_one_line_error(exc, f"--data-dir {tmp_path / 'nowhere'} does not exist")
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(DatasetError) as exc:
        catalog.load_dataset(name, tmp_path / "a-file")
    assert_one_line_error(exc, "is not a directory")


def test_incomplete_directory_names_missing_file(tmp_path):
    make_mnist_dir(tmp_path / "mnist")
    (tmp_path / "mnist" / (IDX_NAMES["test_images"] + ".gz")).unlink()
    with pytest.raises(DatasetError) as exc:
        catalog.load_dataset("mnist", tmp_path)
    assert_one_line_error(exc, "incomplete", IDX_NAMES["test_images"], "syncbench data fetch")


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(DatasetError) as exc:
        catalog.load_dataset("imagenet")
    assert_one_line_error(exc, "imagenet", *catalog.DATASETS)
    with pytest.raises(DatasetError):
        catalog.find_dataset_dir("synthetic")


def _corrupt_labels_out_of_range(d: Path) -> str:
    labels = np.zeros(12, dtype=np.uint8)
    labels[7] = 10
    write_idx(d / (IDX_NAMES["train_labels"] + ".gz"), labels, gz=True)
    return IDX_NAMES["train_labels"]


def _corrupt_count_mismatch(d: Path) -> str:
    write_idx(d / (IDX_NAMES["test_labels"] + ".gz"), np.zeros(4, dtype=np.uint8), gz=True)
    return IDX_NAMES["test_labels"]


def _corrupt_image_size(d: Path) -> str:
    write_idx(d / (IDX_NAMES["train_images"] + ".gz"), np.zeros((12, 32, 32), np.uint8), True)
    return IDX_NAMES["train_images"]


def _corrupt_truncated(d: Path) -> str:
    p = d / (IDX_NAMES["test_images"] + ".gz")
    p.write_bytes(gzip.compress(gzip.decompress(p.read_bytes())[:-100]))
    return IDX_NAMES["test_images"]


def _corrupt_bad_gzip(d: Path) -> str:
    p = d / (IDX_NAMES["train_images"] + ".gz")
    blob = p.read_bytes()
    p.write_bytes(blob[: len(blob) // 2])
    return IDX_NAMES["train_images"]


def _corrupt_wrong_magic(d: Path) -> str:
    p = d / (IDX_NAMES["test_labels"] + ".gz")
    p.write_bytes(gzip.compress(b"PK\x03\x04" + gzip.decompress(p.read_bytes())[4:]))
    return IDX_NAMES["test_labels"]


def _corrupt_trailing(d: Path) -> str:
    p = d / (IDX_NAMES["train_labels"] + ".gz")
    p.write_bytes(gzip.compress(gzip.decompress(p.read_bytes()) + b"\x01"))
    return IDX_NAMES["train_labels"]


def _corrupt_labels_dtype(d: Path) -> str:
    write_idx(d / (IDX_NAMES["train_labels"] + ".gz"), np.zeros(12, dtype=np.int32), gz=True)
    return IDX_NAMES["train_labels"]


@pytest.mark.parametrize(
    "corrupt, needle",
    [
        (_corrupt_labels_out_of_range, "out of range"),
        (_corrupt_count_mismatch, "holds 4 labels"),
        (_corrupt_image_size, "28x28"),
        (_corrupt_truncated, "truncated"),
        (_corrupt_bad_gzip, "bad gzip"),
        (_corrupt_wrong_magic, "not an IDX file"),
        (_corrupt_trailing, "trailing bytes"),
        (_corrupt_labels_dtype, "uint8 labels"),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_corrupt_mnist_files(tmp_path, corrupt, needle):
    make_mnist_dir(tmp_path / "mnist")
    bad_file = corrupt(tmp_path / "mnist")
    with pytest.raises(DatasetError) as exc:
        catalog.load_dataset("mnist", tmp_path)
    assert_one_line_error(exc, bad_file, needle, "syncbench data fetch mnist")


# --- CIFAR-10 ------------------------------------------------------------------------


def test_cifar_batch_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.integers(0, 256, (4, 3, 32, 32), dtype=np.uint8)
    y = np.array([0, 9, 5, 3], dtype=np.uint8)
    path = tmp_path / "data_batch_1.bin"
    path.write_bytes(cifar_bytes(x, y))
    images, labels = formats.read_cifar10_batch(path)
    assert images.shape == (4, 3, 32, 32) and images.dtype == np.uint8
    assert labels.shape == (4,) and labels.dtype == np.int64
    np.testing.assert_array_equal(images, x)
    np.testing.assert_array_equal(labels, y)
    # Channel planes are red, green, blue, each row-major.
    raw = path.read_bytes()
    assert images[1, 0, 0, 5] == raw[3073 + 1 + 5]
    assert images[1, 2, 31, 31] == raw[2 * 3073 - 1]


@pytest.mark.parametrize("layout", ["flat", "named", "batches-bin", "named/batches-bin"])
def test_load_cifar10(tmp_path, layout):
    sub = {"flat": "", "named": "cifar10", "batches-bin": "cifar-10-batches-bin",
           "named/batches-bin": "cifar10/cifar-10-batches-bin"}[layout]
    directory = tmp_path / sub if sub else tmp_path
    train_x, train_y, test_x, test_y = make_cifar_dir(directory, per_batch=3)
    ds = catalog.load_dataset("cifar10", tmp_path)
    assert ds.source == str(directory)
    assert ds.train_x.shape == (15, 3, 32, 32) and ds.test_x.shape == (3, 3, 32, 32)
    assert ds.input_shape == (3, 32, 32) and ds.num_classes == 10
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int64
    np.testing.assert_array_equal(np.rint(ds.train_x * 255).astype(np.uint8), train_x)
    np.testing.assert_array_equal(np.rint(ds.test_x * 255).astype(np.uint8), test_x)
    np.testing.assert_array_equal(ds.train_y, train_y)
    np.testing.assert_array_equal(ds.test_y, test_y)


@pytest.mark.parametrize(
    "size_or_label", ["size+1", "size-1", "empty", "label"], ids=str
)
def test_cifar_corruption(tmp_path, size_or_label):
    make_cifar_dir(tmp_path, per_batch=2)
    path = tmp_path / "data_batch_3.bin"
    blob = bytearray(path.read_bytes())
    if size_or_label == "size+1":
        blob += b"\x00"
    elif size_or_label == "size-1":
        blob = blob[:-1]
    elif size_or_label == "empty":
        blob = bytearray()
    else:
        blob[3073] = 10
    path.write_bytes(bytes(blob))
    with pytest.raises(DatasetError) as exc:
        formats.read_cifar10_batch(path)
    assert_one_line_error(exc, str(path))
    with pytest.raises(DatasetError) as exc:
        catalog.load_dataset("cifar10", tmp_path)
    assert_one_line_error(exc, "data_batch_3.bin", "syncbench data fetch cifar10")


# --- synthetic -----------------------------------------------------------------------


def test_synthetic_deterministic_and_shaped():
    a = catalog.load_dataset("synthetic", synthetic_train=300, synthetic_test=100, seed=3)
    b = catalog.make_synthetic(300, 100, (1, 28, 28), 10, 3)
    c = catalog.load_dataset("synthetic", synthetic_train=300, synthetic_test=100, seed=4)
    for field in ("train_x", "train_y", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(a, field), getattr(b, field))
    assert not np.array_equal(a.train_x, c.train_x)
    assert a.source == "generated" and a.name == "synthetic"
    assert a.train_x.shape == (300, 1, 28, 28) and a.test_x.shape == (100, 1, 28, 28)
    assert a.train_x.dtype == np.float32 and a.train_y.dtype == np.int64
    assert a.train_x.min() >= 0.0 and a.train_x.max() <= 1.0
    assert set(np.unique(a.train_y)) <= set(range(10))

    rgb = catalog.make_synthetic(50, 20, (3, 16, 12), 4, 0)
    assert rgb.input_shape == (3, 16, 12) and rgb.num_classes == 4
    assert rgb.train_y.max() < 4 and rgb.test_x.shape == (20, 3, 16, 12)


@pytest.mark.parametrize(
    "kwargs",
    [dict(n_train=0), dict(n_test=0), dict(classes=1), dict(shape=(28, 28)),
     dict(shape=(1, 0, 28)), dict(shape="abc")],
    ids=str,
)
def test_synthetic_bad_arguments(kwargs):
    args = dict(n_train=10, n_test=10, shape=(1, 28, 28), classes=10, seed=0) | kwargs
    with pytest.raises(DatasetError) as exc:
        catalog.make_synthetic(**args)
    assert_one_line_error(exc, "synthetic")


def softmax_regression_accuracy(ds: catalog.Dataset, steps: int = 300, lr: float = 0.5) -> float:
    rng = np.random.default_rng(0)
    x = ds.train_x.reshape(ds.num_train, -1)
    xt = ds.test_x.reshape(ds.num_test, -1)
    w = np.zeros((x.shape[1], ds.num_classes), np.float32)
    b = np.zeros(ds.num_classes, np.float32)
    batch = 256
    for _ in range(steps):
        i = rng.integers(0, ds.num_train, batch)
        xi = x[i]
        z = xi @ w + b
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[np.arange(batch), ds.train_y[i]] -= 1.0
        p /= batch
        w -= lr * (xi.T @ p)
        b -= lr * p.sum(axis=0)
    return float(((xt @ w + b).argmax(axis=1) == ds.test_y).mean())


def test_synthetic_is_learnable():
    ds = catalog.load_dataset("synthetic")  # default size: 8192 train, 2048 test
    assert ds.train_x.shape == (8192, 1, 28, 28) and ds.test_x.shape == (2048, 1, 28, 28)
    acc = softmax_regression_accuracy(ds)
    assert acc > 0.8, acc
    assert acc < 0.999, "synthetic data should not be trivially separable"


# --- fuzz ----------------------------------------------------------------------------


def _fuzz_blobs(rng: np.random.Generator) -> list[bytes]:
    seeds = [
        idx_bytes(np.arange(3 * 28 * 28, dtype=np.int64).astype(np.uint8).reshape(3, 28, 28)),
        idx_bytes(np.arange(5, dtype=np.uint8)),
        idx_bytes(np.arange(6, dtype=np.int32).reshape(2, 3)),
    ]
    if SYSTEM_FMNIST.is_dir():
        with gzip.open(SYSTEM_FMNIST / "t10k-labels-idx1-ubyte.gz") as fh:
            seeds.append(fh.read(64))
        with gzip.open(SYSTEM_FMNIST / "t10k-images-idx3-ubyte.gz") as fh:
            seeds.append(fh.read(4096))
    blobs = []
    for i in range(200):
        kind = i % 5
        if kind == 0:  # pure noise
            blobs.append(rng.bytes(int(rng.integers(0, 80))))
        elif kind == 1:  # a valid-looking header with random type/ndim/dims
            head = bytes([0, 0, int(rng.choice([8, 9, 11, 12, 13, 14, 7])),
                          int(rng.integers(0, 5))])
            blobs.append(head + rng.bytes(int(rng.integers(0, 40))))
        elif kind == 2:  # truncated real or generated header/payload
            s = seeds[int(rng.integers(len(seeds)))]
            blobs.append(s[: int(rng.integers(0, len(s) + 1))])
        elif kind == 3:  # bit flips in a valid file, maybe gzipped and truncated
            s = bytearray(seeds[int(rng.integers(len(seeds)))])
            for _ in range(int(rng.integers(1, 4))):
                s[int(rng.integers(len(s)))] ^= 1 << int(rng.integers(8))
            blob = bytes(s)
            if rng.random() < 0.5:
                blob = gzip.compress(blob)
                blob = blob[: int(rng.integers(0, len(blob) + 1))]
            blobs.append(blob)
        else:  # CIFAR-sized records with random labels, or gzip magic plus noise
            if rng.random() < 0.5:
                n = int(rng.integers(0, 3))
                blobs.append(rng.bytes(n * 3073 + int(rng.choice([0, 0, 1, -1]) if n else 0)))
            else:
                blobs.append(b"\x1f\x8b" + rng.bytes(int(rng.integers(0, 60))))
    return blobs


def test_fuzz_readers_raise_only_dataset_error(tmp_path):
    rng = np.random.default_rng(12345)
    outcomes = {"ok": 0, "error": 0}
    for i, blob in enumerate(_fuzz_blobs(rng)):
        path = tmp_path / f"fuzz-{i}"
        path.write_bytes(blob)
        for reader in (formats.read_idx, formats.read_cifar10_batch):
            try:
                result = reader(path)
            except DatasetError as e:
                assert "\n" not in str(e) and path.name in str(e)
                outcomes["error"] += 1
            else:
                arrays = result if isinstance(result, tuple) else (result,)
                assert all(isinstance(a, np.ndarray) for a in arrays)
                outcomes["ok"] += 1
    assert outcomes["error"] > 0 and outcomes["ok"] > 0, outcomes


# --- checksums -----------------------------------------------------------------------


def test_md5_verification(tmp_path):
    path = tmp_path / "train-images-idx3-ubyte.gz"
    payload = b"not really fashion-mnist" * 1000
    path.write_bytes(payload)
    good = hashlib.md5(payload).hexdigest()
    assert fetch.file_md5(path) == good
    fetch.verify_md5(path, good)
    fetch.verify_md5(path, good.upper())
    with pytest.raises(DatasetError) as exc:
        fetch.verify_md5(path, catalog.OFFICIAL_MD5["fashion-mnist"][path.name])
    assert_one_line_error(exc, str(path), "checksum mismatch", good)
    with pytest.raises(DatasetError) as exc:
        fetch.verify_md5(tmp_path / "absent.gz", good)
    assert_one_line_error(exc, "absent.gz")


def test_official_checksum_table_is_complete():
    for name in ("fashion-mnist", "mnist"):
        assert set(catalog.OFFICIAL_MD5[name]) == {n + ".gz" for n in IDX_NAMES.values()}
    assert set(catalog.OFFICIAL_MD5["cifar10"]) == {"cifar-10-binary.tar.gz"}
    for table in catalog.OFFICIAL_MD5.values():
        for digest in table.values():
            assert len(digest) == 32 and int(digest, 16) >= 0


def test_fetch_synthetic_and_unknown(tmp_path):
    assert fetch.fetch_dataset("synthetic", tmp_path) == []
    with pytest.raises(DatasetError) as exc:
        fetch.fetch_dataset("nope", tmp_path)
    assert_one_line_error(exc, "nope", "fashion-mnist")


def _patch_spec(monkeypatch, name: str, **changes) -> None:
    """Point dataset *name*'s catalog entry at other mirrors or checksums for one test."""
    spec = dataclasses.replace(catalog.CATALOG[name], **changes)
    monkeypatch.setitem(catalog.CATALOG, name, spec)


def _serve_dir(directory: Path) -> str:
    """A file:// base URL for *directory* (lets fetch run offline)."""
    return directory.resolve().as_uri() + "/"


def test_fetch_mnist_offline_mirrors_and_checksums(tmp_path, monkeypatch):
    """fetch_dataset's real download path, fed from local file:// "mirrors"."""
    served = tmp_path / "served"
    make_mnist_dir(served, n_train=8, n_test=3, gz=True)
    md5s = {name: fetch.file_md5(served / name) for name in catalog.OFFICIAL_MD5["mnist"]}
    dead = _serve_dir(tmp_path / "dead-mirror")  # does not exist: first mirror fails
    _patch_spec(monkeypatch, "mnist", md5=md5s, mirrors=(dead, _serve_dir(served)))
    dest = tmp_path / "dest"
    paths = fetch.fetch_dataset("mnist", dest)
    assert sorted(p.name for p in paths) == sorted(md5s)
    assert not list(dest.glob("*.part"))
    ds = catalog.load_dataset("mnist", dest)
    assert ds.train_x.shape == (8, 1, 28, 28)
    # Second run: files present with the right checksum are kept, not re-downloaded.
    _patch_spec(monkeypatch, "mnist", mirrors=(dead,))
    assert fetch.fetch_dataset("mnist", dest) == paths

    # A mirror serving different bytes fails the checksum and leaves no file behind.
    bad = dict(md5s)
    bad["t10k-labels-idx1-ubyte.gz"] = "0" * 32
    _patch_spec(monkeypatch, "mnist", md5=bad, mirrors=(_serve_dir(served),))
    dest2 = tmp_path / "dest2"
    with pytest.raises(DatasetError) as exc:
        fetch.fetch_dataset("mnist", dest2)
    assert_one_line_error(exc, "t10k-labels-idx1-ubyte.gz", "checksum mismatch")
    assert not (dest2 / "t10k-labels-idx1-ubyte.gz").exists()
    assert not list(dest2.glob("*.part"))

    # Every mirror unreachable: a network-style error naming the file.
    _patch_spec(monkeypatch, "mnist", mirrors=(dead,))
    with pytest.raises(DatasetError) as exc:
        fetch.fetch_dataset("mnist", tmp_path / "dest3")
    assert_one_line_error(exc, "train-images-idx3-ubyte.gz", "download failed")


def test_fetch_cifar10_offline_extracts_binary_batches(tmp_path, monkeypatch):
    batches = tmp_path / "cifar-10-batches-bin"
    train_x, train_y, test_x, test_y = make_cifar_dir(batches, per_batch=2)
    served = tmp_path / "served"
    served.mkdir()
    tarball = served / "cifar-10-binary.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(batches, arcname="cifar-10-batches-bin")
        info = tarfile.TarInfo("cifar-10-batches-bin/readme.html")
        info.size = 5
        tar.addfile(info, io.BytesIO(b"hello"))
    _patch_spec(monkeypatch, "cifar10", md5={"cifar-10-binary.tar.gz": fetch.file_md5(tarball)},
                mirrors=(_serve_dir(served),))
    dest = tmp_path / "dest"
    paths = fetch.fetch_dataset("cifar10", dest)
    assert [p.name for p in paths] == CIFAR_NAMES
    assert not (dest / "cifar-10-binary.tar.gz").exists()
    assert not (dest / "readme.html").exists()
    ds = catalog.load_dataset("cifar10", dest)
    np.testing.assert_array_equal(np.rint(ds.test_x * 255).astype(np.uint8), test_x)
    np.testing.assert_array_equal(ds.train_y, train_y)
