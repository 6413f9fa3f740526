"""The model zoo: ``mlp`` and ``lenet``, built over flat buffers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from syncbench.kernels.backend import Backend
from syncbench.kernels.layers import Conv2d, Flatten, Layer, Linear, MaxPool2d, ReLU
from syncbench.kernels.model import Model

Shape = tuple[int, ...]


def mlp_layers(input_shape: Shape, num_classes: int) -> list[Layer]:
    """784-256-128-10 style perceptron with ReLU (input size from the data)."""
    features = int(np.prod(input_shape))
    return [
        Flatten(),
        Linear(features, 256),
        ReLU(),
        Linear(256, 128),
        ReLU(),
        Linear(128, num_classes),
    ]


def lenet_layers(input_shape: Shape, num_classes: int) -> list[Layer]:
    """LeNet-5 style: conv5-pool-conv5-pool-120-84-classes.

    28x28 inputs get padding 2 on the first convolution (as in LeNet-5 on
    MNIST); 32x32 inputs (CIFAR-10, 3 channels) get none.
    """
    channels, height, width = input_shape
    if (height, width) not in ((28, 28), (32, 32)):
        raise ValueError(f"lenet takes 28x28 or 32x32 inputs, got {height}x{width}")
    pad = 2 if height == 28 else 0
    return [
        Conv2d(channels, 6, 5, padding=pad),
        ReLU(),
        MaxPool2d(2),
        Conv2d(6, 16, 5),
        ReLU(),
        MaxPool2d(2),
        Flatten(),
        Linear(16 * 5 * 5, 120),
        ReLU(),
        Linear(120, 84),
        ReLU(),
        Linear(84, num_classes),
    ]


MODELS: dict[str, Callable[[Shape, int], list[Layer]]] = {
    "mlp": mlp_layers,
    "lenet": lenet_layers,
}


def build_model(
    name: str,
    input_shape: Shape,
    num_classes: int,
    backend: Backend | None = None,
    dtype: Any = np.float32,
    seed: int = 0,
) -> Model:
    """Build model ``name`` with deterministic initial parameters from ``seed``."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}")
    layers = MODELS[name](tuple(input_shape), num_classes)
    return Model(name, layers, input_shape, num_classes, backend, dtype, seed)
