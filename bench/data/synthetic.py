"""The ``synthetic`` dataset: generated on the fly, deterministic for a seed, learnable.

Scaling studies must not depend on files, so any size, image shape and
number of classes can be generated. Each class has a smooth prototype image
(a few Gaussian blobs per channel); a sample is its class prototype blended
with up to 40% of another class's, scaled by a random contrast,
plus Gaussian pixel noise, clipped to ``[0, 1]``: well above chance for a
linear model but not perfectly separable, so training curves mean something
(``tests/unit/test_data.py::test_synthetic_is_learnable`` checks both). Images
are float32 ``(n, C, H, W)``, labels int64, as the file datasets load.
"""

from __future__ import annotations

import numpy as np

from syncbench.bench.data.dataset import Dataset, DatasetError

_SYN_BLOBS = 4  # Gaussian blobs per class prototype and channel
_SYN_NOISE = 0.3  # pixel noise standard deviation
_SYN_MIX = 0.4  # largest weight of another class's prototype blended into a sample
#: Names this generator in a run file's record of its data (a change to how samples are
#: made takes a new version, so equal records mean equal data).
GENERATOR = "syncbench-synthetic/1"


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

    ``n_train`` and ``n_test`` samples of ``shape`` (C, H, W) in ``classes`` classes, made
    as the module says. The same arguments always give identical arrays (train and test
    come from one generator, so sizes are part of what must match).

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
        generator={"generator": GENERATOR, "train": int(n_train), "test": int(n_test),
                   "shape": [c, h, w], "classes": int(classes),
                   "seed": None if seed is None else int(seed)},
    )
