"""Each convolution and BatchNorm of a model, ours against PyTorch's, one layer at a time.

Usage (PyTorch importable, e.g. ``PYTHONPATH`` on an install of it):
    OMP_NUM_THREADS=1 python tools/layers_vs_torch.py [MODEL] [--blocks 7] [--reps 10]
    OMP_NUM_THREADS=1 python tools/layers_vs_torch.py mlp --linear

For every distinct convolution and BatchNorm of MODEL (default resnet8; batch 64,
28 x 28 inputs) the forward plus backward time of one call, ours (the CPU layer, on
the (C, H, W, N) memory it is handed in a model, its ReLU fused where the model
fuses it) and PyTorch's (``torch.nn.Conv2d``, ``torch.nn.BatchNorm2d`` then
``relu``; one thread), in one process, the two alternating in blocks of ``reps``
calls in a shuffled order, so a drift of the machine falls on both. Printed per
layer: how many the model has, the medians (ms per call) and their ratio; then
each kind's total over the model's layers, and the GEMM floor of our
convolutions: their FLOPs (forward, weight and input gradient) at the rate
``numpy.matmul`` reaches on the forward GEMM's shape (one output row of columns,
the chunk the convolutions stream), the time BLAS alone needs however the rest of
the layer is written. Set beside PyTorch's whole step (``syncbench peers
--speed``): where the floor is above it divided by a target ratio, no
im2col-and-BLAS convolution reaches that ratio. ``--linear`` times instead
the GEMMs of MODEL's dense layers (forward, weight gradient, and the input
gradient where the layer computes one), ``numpy.matmul`` against ``torch.mm``
on the same arrays, median of 300 calls each. Measured in docs/RESULTS.md.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np
import torch
from conv_ab import matmul_rate  # this folder's script: the same GEMM timing

from syncbench.kernels import cpu_conv
from syncbench.kernels.layers import BatchNorm2d, Conv2d, Linear, all_layers
from syncbench.kernels.zoo import build_model

BATCH = 64


def _captured(model_name: str) -> list[tuple[object, tuple[int, ...]]]:
    """(layer, NCHW input shape) of every Conv2d and BatchNorm2d in one forward pass."""
    m = build_model(model_name, (1, 28, 28), 10)
    seen: list[tuple[object, tuple[int, ...]]] = []
    for layer in all_layers(m.layers):
        if isinstance(layer, (Conv2d, BatchNorm2d)):
            def spy(x, train=True, _f=layer.forward, _l=layer):
                seen.append((_l, tuple(x.shape)))
                return _f(x, train)
            layer.forward = spy
    x = np.random.default_rng(0).standard_normal((BATCH, 1, 28, 28)).astype(np.float32)
    m.forward(x)
    for layer, _ in seen:
        del layer.forward  # the class's method again
    return seen


def _ours(layer: object, shape: tuple[int, ...]):
    """A call of our layer's forward and backward on (C, H, W, N) memory of ``shape``."""
    rng = np.random.default_rng(1)
    n, c, h, w = shape
    x = cpu_conv.nchw(rng.standard_normal((c, h, w, n)).astype(np.float32))
    y = layer.forward(x)
    dy = cpu_conv.nchw(rng.standard_normal(cpu_conv.stored(y).shape).astype(np.float32))

    def call() -> None:
        layer.forward(x)
        layer.backward(dy)
    return call


def _theirs(layer: object, shape: tuple[int, ...]):
    """The same layer in PyTorch, forward and backward."""
    torch.manual_seed(0)
    x = torch.randn(*shape, requires_grad=bool(layer.needs_input_grad))
    if isinstance(layer, Conv2d):
        module = torch.nn.Conv2d(layer.cin, layer.cout, layer.k, layer.stride, layer.pad,
                                 bias=layer.bias)
        def run(t):
            return module(t)
    else:
        module = torch.nn.BatchNorm2d(layer.channels)
        def run(t):
            out = module(t)
            return torch.relu(out) if layer.fused_relu else out
    dy = torch.randn_like(run(x))

    def call() -> None:
        run(x).backward(dy)
    return call


def _gemm_floor(layer: Conv2d, shape: tuple[int, ...]) -> float:
    """ms of the convolution's GEMMs' FLOPs (forward, weight gradient and, where it has one,
    input gradient) at numpy.matmul's rate on one output row of its forward GEMM
    (:func:`conv_ab.matmul_rate`, the best of 20)."""
    n, c, h, w = shape
    g = cpu_conv.ConvGeometry(n, c, h, w, layer.k, layer.pad, layer.stride)
    rng = np.random.default_rng(2)
    rate = matmul_rate(rng.random((layer.cout, g.rows), dtype=np.float32),
                       rng.random((g.rows, g.per_row), dtype=np.float32))
    passes = 3 if layer.needs_input_grad else 2
    return passes * 2.0 * layer.cout * g.rows * g.oh * g.per_row / (rate * 1e9) * 1e3


def _median_ms(call, repeats: int = 300) -> float:
    call()
    spent = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        spent.append(time.perf_counter() - start)
    return float(np.median(spent)) * 1e3


def linear_gemms(model_name: str) -> None:
    """numpy.matmul against torch.mm at the GEMM shapes of the model's dense layers."""
    m = build_model(model_name, (1, 28, 28), 10)
    shapes = []
    dense = [layer for layer in all_layers(m.layers) if isinstance(layer, Linear)]
    for index, layer in enumerate(dense):
        i, o = layer.in_features, layer.out_features
        shapes += [(f"{layer!r} forward", BATCH, i, o), (f"{layer!r} weight gradient", i, BATCH, o)]
        if index > 0:  # the first dense layer of a model computes no input gradient
            shapes.append((f"{layer!r} input gradient", BATCH, o, i))
    rng = np.random.default_rng(0)
    print(f"# {model_name}: dense layers' GEMMs, batch {BATCH}, float32, ms (median of 300); "
          f"torch {torch.__version__}, 1 thread")
    ours_total = theirs_total = 0.0
    for name, rows, inner, cols in shapes:
        a = rng.random((rows, inner), dtype=np.float32)
        b = rng.random((inner, cols), dtype=np.float32)
        out = np.empty((rows, cols), np.float32)
        ta, tb, tout = torch.from_numpy(a), torch.from_numpy(b), torch.empty(rows, cols)
        ours = _median_ms(lambda a=a, b=b, out=out: np.matmul(a, b, out=out))
        theirs = _median_ms(lambda ta=ta, tb=tb, tout=tout: torch.mm(ta, tb, out=tout))
        ours_total, theirs_total = ours_total + ours, theirs_total + theirs
        flops = 2.0 * rows * inner * cols / 1e6
        print(f"  {name:40.40s} {rows:5d} x {inner:5d} x {cols:5d}  numpy {ours:7.4f} "
              f"({flops / ours:6.1f} GFLOP/s)  torch {theirs:7.4f} ({flops / theirs:6.1f})")
    print(f"  all {'':36s} {'':21s}  numpy {ours_total:7.4f}  torch {theirs_total:7.4f}"
          f"  numpy/torch {ours_total / theirs_total:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", nargs="?", default="resnet8")
    parser.add_argument("--blocks", type=int, default=7)
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--linear", action="store_true",
                        help="the dense layers' GEMMs, numpy.matmul against torch.mm")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.linear:
        linear_gemms(args.model)
        return
    counts: collections.Counter = collections.Counter()
    cases = {}
    for layer, shape in _captured(args.model):
        key = (repr(layer) + (" + ReLU" if getattr(layer, "fused_relu", False) else ""), shape)
        counts[key] += 1
        if key not in cases:
            cases[key] = (layer, shape, _ours(layer, shape), _theirs(layer, shape))
    times = {key: ([], []) for key in cases}
    order = np.random.default_rng(0)
    for _ in range(args.blocks):
        for index in order.permutation(len(cases) * 2):
            key = list(cases)[index // 2]
            call = cases[key][2 + index % 2]
            call()
            start = time.perf_counter()
            for _ in range(args.reps):
                call()
            times[key][index % 2].append((time.perf_counter() - start) / args.reps * 1e3)
    print(f"# {args.model}: one layer's forward + backward, batch {BATCH}, ms per call, median of "
          f"{args.blocks} blocks of {args.reps}; torch {torch.__version__}, 1 thread")
    print(f"  {'layer':44s} {'input':>16s} count {'ours':>8s} {'torch':>8s} ours/torch")
    total = collections.defaultdict(lambda: [0.0, 0.0])
    floor = 0.0
    for key, (layer, shape, _, _) in cases.items():
        ours, theirs = (float(np.median(t)) for t in times[key])
        kind = "Conv2d" if isinstance(layer, Conv2d) else "BatchNorm2d"
        total[kind][0] += counts[key] * ours
        total[kind][1] += counts[key] * theirs
        if isinstance(layer, Conv2d):
            floor += counts[key] * _gemm_floor(layer, shape)
        print(f"  {key[0]:44.44s} {'x'.join(map(str, shape)):>16s} {counts[key]:5d} "
              f"{ours:8.3f} {theirs:8.3f} {ours / theirs:10.3f}")
    for kind, (ours, theirs) in total.items():
        print(f"  all {kind:40s} {'':>16s} {'':5s} {ours:8.3f} {theirs:8.3f} {ours / theirs:10.3f}")
    print(f"  GEMM floor of our convolutions (their FLOPs at numpy.matmul's rate on one output "
          f"row): {floor:.3f} ms")


if __name__ == "__main__":
    main()
