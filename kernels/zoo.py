"""The model zoo: ``mlp``, ``lenet``, ``resnet8``, ``resnet20`` and ``gpt``, built over flat
buffers.

``mlp:H1,H2,...`` is the perceptron with the given hidden widths (``mlp`` is
``mlp:256,128``): the model size is a knob, so communication/computation
ratios can be varied in real runs (``mlp:4096,4096`` has about 20M
parameters on 28x28 inputs). ``gpt:d=N,layers=N,heads=N,ctx=N`` is the
decoder-only transformer of :mod:`syncbench.kernels.gpt` on byte tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from syncbench.kernels.backend import Backend
from syncbench.kernels.gpt import GPT, parse_gpt_spec
from syncbench.kernels.layers import (
    BasicBlock,
    BatchNorm2d,
    Conv2d,
    Flatten,
    GlobalAvgPool,
    Layer,
    Linear,
    MaxPool2d,
    ReLU,
    all_layers,
)
from syncbench.kernels.model import Model

Shape = tuple[int, ...]


def mlp_layers(
    input_shape: Shape, num_classes: int, hidden: Sequence[int] = (256, 128)
) -> list[Layer]:
    """784-256-128-10 style perceptron with ReLU (input size from the data)."""
    layers: list[Layer] = [Flatten()]
    width = int(np.prod(input_shape))
    for h in hidden:
        layers += [Linear(width, int(h)), ReLU()]
        width = int(h)
    return layers + [Linear(width, num_classes)]


def parse_mlp_widths(name: str) -> tuple[int, ...] | None:
    """Hidden widths of ``mlp:H1,H2,...`` (``None`` for any other name).

    ``ValueError`` with one line when the widths are not positive integers.
    """
    base, sep, widths = name.partition(":")
    if base != "mlp" or not sep:
        return None
    try:
        hidden = tuple(int(w) for w in widths.split(","))
    except ValueError:
        hidden = ()
    if not hidden or min(hidden) < 1:
        raise ValueError(f"model {name!r}: expected mlp:H1,H2,... with positive integer widths")
    return hidden


def split_models(text: str) -> list[str]:
    """A comma-separated list of models whose specs hold commas of their own:
    ``"mlp:256,128,gpt:d=64,layers=2,lenet"`` -> ``["mlp:256,128", "gpt:d=64,layers=2",
    "lenet"]``. A piece without ``:`` that names no model continues the spec before it."""
    models: list[str] = []
    for piece in (p.strip() for p in text.split(",")):
        if not piece:
            continue
        if models and ":" in models[-1] and ":" not in piece and piece not in MODELS:
            models[-1] += "," + piece
        else:
            models.append(piece)
    return models


def model_name(name: str) -> str:
    """``name`` if it names a model (a key of :data:`MODELS`, ``mlp:H1,...`` or
    ``gpt:KEY=N,...``), for argparse."""
    if name not in MODELS and parse_mlp_widths(name) is None and parse_gpt_spec(name) is None:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(MODELS)}, "
                         "mlp:H1,H2,... or gpt:d=N,layers=N,heads=N,ctx=N")
    return name


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


def resnet_layers(input_shape: Shape, num_classes: int, blocks: int) -> list[Layer]:
    """The CIFAR ResNets of He et al. 2016 (section 4.2), 6 * ``blocks`` + 2 layers deep.

    conv3x3(16)-BN-ReLU, three stages of ``blocks`` basic blocks with 16, 32
    and 64 channels (the first block of stages 2 and 3 subsamples by 2, with
    the paper's parameter-free option-A shortcut), global average pooling and
    one linear layer. Convolutions have no bias (BatchNorm follows each).
    28x28 inputs (MNIST, Fashion-MNIST) give planes of 28, 14 and 7; 32x32
    (CIFAR-10) 32, 16 and 8.
    """
    channels, height, width = input_shape
    if (height, width) not in ((28, 28), (32, 32)):
        raise ValueError(f"resnet takes 28x28 or 32x32 inputs, got {height}x{width}")
    layers: list[Layer] = [Conv2d(channels, 16, 3, padding=1, bias=False), BatchNorm2d(16),
                           ReLU()]
    width_in = 16
    for stage, width_out in enumerate((16, 32, 64)):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(BasicBlock(width_in, width_out, stride))
            width_in = width_out
    return layers + [GlobalAvgPool(), Linear(64, num_classes)]


def model_context(name: str) -> int | None:
    """The context (tokens) of a language model ``name``; None for an image model."""
    spec = parse_gpt_spec(name)
    return None if spec is None else spec.ctx


MODELS: dict[str, Callable[[Shape, int], list[Layer]]] = {
    "mlp": mlp_layers,
    "lenet": lenet_layers,
    "resnet8": lambda shape, classes: resnet_layers(shape, classes, 1),
    "resnet20": lambda shape, classes: resnet_layers(shape, classes, 3),
}


def model_layers(name: str, input_shape: Shape, num_classes: int) -> list[Layer]:
    """The layers of model ``name`` (of :data:`MODELS`, or ``mlp:H1,...``), unbound."""
    if parse_gpt_spec(name) is not None:
        raise ValueError(f"model {name!r} is not a sequence of layers: use build_model")
    hidden = parse_mlp_widths(name)
    if hidden is not None:
        return mlp_layers(tuple(input_shape), num_classes, hidden)
    return MODELS[model_name(name)](tuple(input_shape), num_classes)


def has_batchnorm(name: str) -> bool:
    """Whether model ``name`` has BatchNorm layers (running statistics, ``--sync-bn``),
    from its layers on 28x28 inputs (every image model of the zoo takes those)."""
    if parse_gpt_spec(name) is not None:
        return False
    layers = all_layers(model_layers(name, (1, 28, 28), 10))
    return any(isinstance(layer, BatchNorm2d) for layer in layers)


def build_model(
    name: str,
    input_shape: Shape,
    num_classes: int,
    backend: Backend | None = None,
    dtype: Any = np.float32,
    seed: int = 0,
) -> Model:
    """Build model ``name`` with deterministic initial parameters from ``seed`` (``gpt``:
    ``input_shape`` is its (ctx,) and ``num_classes`` the vocabulary)."""
    spec = parse_gpt_spec(name)
    if spec is not None:
        return GPT(spec, num_classes, backend, dtype, seed, name)
    layers = model_layers(name, input_shape, num_classes)
    return Model(name, layers, input_shape, num_classes, backend, dtype, seed)
