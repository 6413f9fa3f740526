"""Settings of the CPU convolution side by side in one process, and each layer's time.

Usage:
    python tools/conv_ab.py MODEL SETTING [SETTING ...] [--blocks 11] [--steps N]
    python tools/conv_ab.py MODEL --layers [--steps 60]
    python tools/conv_ab.py MODEL --gemms
    python tools/conv_ab.py MODEL --kernels

A SETTING is ``native`` (the compiled kernels, kernels/cpu_native.py) or
``KEPT,STREAMED,FOLD[,KEEP][,col2im]`` (the NumPy path): the bytes of a chunk of
columns written into a kept column matrix, of one reused chunk buffer, and of
col2im's column gradient, and the most column bytes training keeps for the weight
gradient (``kernels/cpu_conv.py``: ``CHUNK_BYTES``, ``STREAMED_CHUNK_BYTES``,
``BACKWARD_CHUNK_BYTES``, ``KEEP_COLUMNS_BYTES``; ``4M``, ``512k`` or a number;
KEEP defaults to the module's), and ``col2im`` to fold
every input gradient back instead of computing it as a convolution where
``Conv2d`` would. One model per setting is built (the same seed and batch, so
each keeps its own work arrays) and they run in blocks of steps, in a shuffled
order per block, so a drift of the machine falls on all of them alike. Printed
per setting: the median (min-max) ms per step and the median of its per-block
ratio to the first setting. ``--layers`` prints each layer's forward and backward
ms per step instead (``time.perf_counter`` around every layer, residual blocks'
layers included). ``--gemms`` prints the GFLOP/s of ``numpy.matmul`` (into ``out=``)
at the three GEMM shapes of each distinct convolution of the model (forward, input
gradient, weight gradient), over a chunk of N columns for a few N and over all of
them, beside a 1024^3 product: how far each shape is from BLAS's best. ``--kernels``
prints the GFLOP/s of the compiled kernels (kernels/cpu_native.py) on each distinct
convolution instead: forward, weight gradient and input gradient, as the layer calls
them, caches warm.
Batch 64, float32, 28 x 28 inputs; run with OMP_NUM_THREADS=1.
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np

from syncbench.kernels import cpu_conv, cpu_native
from syncbench.kernels.layers import Conv2d, all_layers
from syncbench.kernels.zoo import build_model

BATCH = 64


def _bytes(text: str) -> int:
    scale = {"k": 1024, "m": 1024 * 1024}.get(text[-1].lower(), 1)
    return int(float(text[:-1] if scale > 1 else text) * scale)


def _setting(text: str) -> tuple[int, int, int, int, bool, bool]:
    if text == "native":
        return (0, 0, 0, 0, False, True)
    parts = text.split(",")
    col2im = parts[-1] == "col2im"
    if col2im:
        parts = parts[:-1]
    if len(parts) not in (3, 4):
        raise argparse.ArgumentTypeError(
            f"a setting is KEPT,STREAMED,FOLD[,KEEP][,col2im], got {text!r}")
    keep = _bytes(parts[3]) if len(parts) == 4 else cpu_conv.KEEP_COLUMNS_BYTES
    return _bytes(parts[0]), _bytes(parts[1]), _bytes(parts[2]), keep, col2im, False


def _batch(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((BATCH, 1, 28, 28)).astype(np.float32),
            rng.integers(0, 10, BATCH))


def compare(model: str, settings: list[tuple[int, int, int, int, bool, bool]], blocks: int,
            steps: int) -> None:
    x, y = _batch()
    models = []
    for *_sizes, col2im, _native in settings:
        m = build_model(model, (1, 28, 28), 10)
        if col2im:
            for layer in all_layers(m.layers):
                if isinstance(layer, Conv2d):
                    layer._grad_as_convolution = lambda g, direct=False: False
        models.append(m)

    def use(index: int) -> None:
        cpu_native.numpy_only = not settings[index][5]
        if settings[index][5]:
            return
        (cpu_conv.CHUNK_BYTES, cpu_conv.STREAMED_CHUNK_BYTES, cpu_conv.BACKWARD_CHUNK_BYTES,
         cpu_conv.KEEP_COLUMNS_BYTES) = settings[index][:4]

    for index, m in enumerate(models):
        use(index)
        for _ in range(3):
            m.loss_and_grad(x, y)
    times = np.zeros((len(settings), blocks))
    for block in range(blocks):
        for index in np.random.default_rng(block).permutation(len(settings)):
            use(index)
            start = time.perf_counter()
            for _ in range(steps):
                models[index].loss_and_grad(x, y)
            times[index, block] = (time.perf_counter() - start) / steps * 1e3
    print(f"# {model}: {blocks} blocks of {steps} steps, batch {BATCH}, ms per step")
    print_comparison(settings, times)


def print_comparison(settings: list[tuple[int, int, int, int, bool, bool]],
                     times: np.ndarray) -> None:
    """One line per setting: its ms per step, median (min-max), and per-block ratio."""
    for (kept, streamed, fold, keep, col2im, native), row in zip(settings, times):
        ratio = row / times[0]
        label = (f"{'native (' + cpu_native.status() + ')':<64.64s}" if native else
                 f"kept {kept:>8} streamed {streamed:>8} fold {fold:>8} keep {keep:>8}"
                 f" {'col2im' if col2im else 'auto  '}")
        print(f"  {label}"
              f"  {np.median(row):8.3f} ({row.min():.3f}-{row.max():.3f})"
              f"  vs first {np.median(ratio):.3f} ({ratio.min():.3f}-{ratio.max():.3f})")


def layer_times(model: str, steps: int) -> None:
    m = build_model(model, (1, 28, 28), 10)
    spent: dict[tuple[str, str], float] = collections.defaultdict(float)
    names = []
    for index, layer in enumerate(all_layers(m.layers)):
        name = f"{index:2d} {layer!r}"
        names.append(name)
        forward, backward = layer.forward, layer.backward

        def timed_forward(x, train=True, _f=forward, _n=name):
            start = time.perf_counter()
            out = _f(x, train)
            spent[_n, "fw"] += time.perf_counter() - start
            return out

        def timed_backward(dy, _b=backward, _n=name):
            start = time.perf_counter()
            out = _b(dy)
            spent[_n, "bw"] += time.perf_counter() - start
            return out

        layer.forward, layer.backward = timed_forward, timed_backward
    x, y = _batch()
    for _ in range(3):
        m.loss_and_grad(x, y)
    spent.clear()
    start = time.perf_counter()
    for _ in range(steps):
        m.loss_and_grad(x, y)
    step = (time.perf_counter() - start) / steps * 1e3
    print(f"# {model}: {steps} steps, batch {BATCH}, ms per step of each layer "
          "(a residual block's time includes its layers')")
    for name in names:
        print(f"  {name:48.48s} forward {spent[name, 'fw'] / steps * 1e3:7.3f}"
              f"  backward {spent[name, 'bw'] / steps * 1e3:7.3f}")
    print(f"  step (forward, loss, backward) {step:.3f}")


def matmul_rate(a: np.ndarray, b: np.ndarray, repeats: int = 20) -> float:
    """GFLOP/s of ``a @ b`` into a kept output, the best of ``repeats``."""
    out = np.empty((a.shape[0], b.shape[1]), np.float32)
    best = float("inf")
    for _ in range(repeats + 1):
        start = time.perf_counter()
        np.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return 2.0 * a.shape[0] * a.shape[1] * b.shape[1] / best / 1e9


def gemm_shapes(model: str) -> None:
    rng = np.random.default_rng(0)
    square = rng.random((1024, 1024), dtype=np.float32)
    print(f"# {model}: numpy.matmul GFLOP/s, float32; 1024^3: {matmul_rate(square, square, 5):.1f}")
    shape, seen = (1, 28, 28), set()
    m = build_model(model, shape, 10)
    for layer in all_layers(m.layers):
        if not isinstance(layer, Conv2d):
            continue
        rows = layer.cin * layer.k * layer.k
        key = (layer.cout, rows)
        if key in seen:
            continue
        seen.add(key)
        total = BATCH * 28 * 28  # the most columns a layer has: a first stage's
        for n in (1792, 7168, total):
            w = rng.random((layer.cout, rows), dtype=np.float32)
            cols = rng.random((rows, n), dtype=np.float32)
            dy = rng.random((layer.cout, n), dtype=np.float32)
            print(f"  {layer!r:40.40s} N {n:6d}: forward {matmul_rate(w, cols):6.1f}"
                  f"  input gradient {matmul_rate(w.T, dy):6.1f}"
                  f"  weight gradient {matmul_rate(cols, dy.T):6.1f}")


def best_time(run, repeats: int = 20) -> float:
    """Seconds of ``run()``, the best of ``repeats`` after one untimed call."""
    run()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def kernel_rates(model: str) -> None:
    """GFLOP/s of the compiled kernels (forward, weight gradient, input gradient) on each
    distinct convolution of ``model``, timed as its layer's calls on the layer's own arrays,
    beside a 1024^3 numpy.matmul: how near the core's limit each runs, caches warm."""
    rng = np.random.default_rng(0)
    square = rng.random((1024, 1024), dtype=np.float32)
    print(f"# {model}: compiled kernels ({cpu_native.status()}), GFLOP/s, float32, batch "
          f"{BATCH}, best of 20, warm caches; numpy.matmul 1024^3: "
          f"{matmul_rate(square, square, 5):.1f}")
    m = build_model(model, (1, 28, 28), 10)
    x, y = _batch()
    m.loss_and_grad(x, y)
    seen = set()
    for layer in all_layers(m.layers):
        if isinstance(layer, Conv2d) and repr(layer) not in seen and layer._direct:
            seen.add(repr(layer))
            print(_layer_kernel_rates(layer, rng))


def _layer_kernel_rates(layer: Conv2d, rng: np.random.Generator) -> str:
    """One line of :func:`kernel_rates`: ``layer``'s three compiled passes, GFLOP/s."""
    g = layer._geometry
    flops = 2.0 * layer.cout * layer.cin * layer.k ** 2 * g.oh * g.ow * g.n
    dy = rng.standard_normal((layer.cout, g.oh * g.ow * g.n), np.float32)
    out = np.empty((layer.cout, g.oh, g.ow, g.n), np.float32)
    planes = layer._planes.copy()
    forward = best_time(lambda: layer._direct_forward(planes, out, out.reshape(layer.cout, -1)))
    weight = best_time(lambda: layer._direct_weight_grad(dy, g))
    line = (f"  {layer!r:44.44s} forward {flops / forward / 1e9:6.1f}"
            f"  weight gradient {flops / weight / 1e9:6.1f}")
    if layer.needs_input_grad:
        grad = best_time(lambda: layer._direct_input_grad(dy, g))
        line += f"  input gradient {flops / grad / 1e9:6.1f}"
    return line


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("settings", nargs="*", type=_setting)
    parser.add_argument("--blocks", type=int, default=11)
    parser.add_argument("--steps", type=int, default=None,
                        help="steps per block (default: 20 for lenet, 3 otherwise; "
                        "60 with --layers)")
    parser.add_argument("--layers", action="store_true")
    parser.add_argument("--gemms", action="store_true")
    parser.add_argument("--kernels", action="store_true")
    args = parser.parse_args()
    if args.gemms:
        gemm_shapes(args.model)
    elif args.kernels:
        kernel_rates(args.model)
    elif args.layers:
        layer_times(args.model, args.steps or 60)
    elif not args.settings:
        parser.error("give at least one SETTING, or --layers")
    else:
        compare(args.model, args.settings, args.blocks,
                args.steps or (20 if args.model == "lenet" else 3))


if __name__ == "__main__":
    main()
