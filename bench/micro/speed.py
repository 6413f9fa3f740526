"""``syncbench speed``: single-process training-step throughput of each model.

Times forward + backward + momentum update of one process (no MPI) on random
inputs of the model's shape, ``--steps`` steps per repeat, and prints the
median over ``--repeats`` in fixed columns, so later changes can be compared
against it. Run it with ``OMP_NUM_THREADS=1`` for the per-rank figure.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.kernels.zoo import build_model

SHAPES = {"mlp": (1, 28, 28), "lenet": (1, 28, 28)}


def input_shape(model_name: str) -> tuple[int, ...]:
    """The input shape the model is timed on (28x28 greyscale unless SHAPES says otherwise)."""
    return SHAPES.get(model_name, (1, 28, 28))


def step_throughput(model_name: str, batch: int, steps: int, repeats: int,
                    dtype: str = "float32", seed: int = 0) -> list[float]:
    """Samples/s of each repeat of ``steps`` training steps."""
    shape = input_shape(model_name)
    model = build_model(model_name, shape, 10, dtype=np.dtype(dtype), seed=seed)
    opt = MomentumSGD(model.params, 0.01, 0.9, 0.0)
    rng = np.random.default_rng(seed)
    x = rng.random((batch, *shape)).astype(dtype)
    y = rng.integers(0, 10, batch)
    for _ in range(3):  # warm-up: allocator, caches
        model.loss_and_grad(x, y)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            model.loss_and_grad(x, y)
            opt.step(model.params, model.grads)
        rates.append(batch * steps / (time.perf_counter() - start))
    return rates


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench speed``."""
    parser.add_argument("--models", default="mlp,lenet", help="comma-separated models")
    parser.add_argument("--batch-size", type=int, default=64, help="batch per step")
    parser.add_argument("--steps", type=int, default=50, help="steps per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="repeats; the median is shown")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                        help="parameter and activation precision")


def main(args: argparse.Namespace) -> int:
    """Time each model of ``--models``; one fixed-column row per model."""
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"# syncbench speed: batch {args.batch_size}, {args.steps} steps x {args.repeats} "
          f"repeats, {args.dtype}, OMP_NUM_THREADS={threads}")
    print(f"# {'model':<8}{'params':>10}{'median [samples/s]':>20}{'min':>12}{'max':>12}"
          f"{'ms/step':>10}")
    for name in args.models.split(","):
        rates = step_throughput(name, args.batch_size, args.steps, args.repeats, args.dtype)
        med = statistics.median(rates)
        size = build_model(name, input_shape(name), 10).size
        print(f"  {name:<8}{size:>10}{med:>20.1f}{min(rates):>12.1f}{max(rates):>12.1f}"
              f"{1000 * args.batch_size / med:>10.3f}")
    return 0
