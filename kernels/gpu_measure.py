"""``python -m syncbench.kernels.gpu_measure``: the GPU figures the kernels are judged by.

Every time is taken with CUDA events around many launches queued back to back
(:func:`event_seconds`): one event before the first and one after the last,
so the ~7 µs a Python launch costs overlaps the previous kernel's run instead
of being counted once per call, as a ``perf_counter`` and a stream
synchronization per call would.

* ``bandwidth``: the element-wise kernels of the hot loop
  (:data:`BANDWIDTH_KERNELS`) on arrays of at least ``--min-bytes`` each
  (default 1 GiB, far beyond the H200's 60 MB L2), their least memory
  traffic (each array read once, each written once: the rule of
  :func:`syncbench.kernels.cuda_bench.bytes_moved`, which the tests check
  each entry against) over the time, beside a device-to-device copy
  (``cudaMemcpyAsync``) of a buffer as large, timed in the same run and
  counted the same way (read + write), and their ratio; with the device's
  reported peak (2 x memory clock x bus width) where the device gives it.
* ``gemm``: the GEMMs as the layers call them (``xp.matmul`` on transposed
  views into ``out=``) against cuBLAS called directly (``cupy.cublas.gemm``
  on the same arrays): TFLOP/s of each and their ratio, at a dense layer's,
  a convolution weight gradient's and one large square shape.

``--json`` writes every figure (the GPU check's ``figures.json`` takes them).
With ``xp`` NumPy (the tests) the same code runs on the host emulator's
kernels at small sizes, timed with ``perf_counter``; CuPy is imported only by
the command line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from syncbench.kernels import cuda_ops

#: Smallest array of a bandwidth measurement: 1 GiB, far beyond any L2.
MIN_BYTES = 1 << 30
#: Launches between the two events of one timing, and timings (the median is kept).
LAUNCHES, REPEAT = 20, 5


def on_gpu(xp: Any) -> bool:
    return getattr(xp, "__name__", "") == "cupy"


def event_seconds(fn: Callable[[], Any], xp: Any, launches: int = LAUNCHES,
                  repeat: int = REPEAT) -> float:
    """Median seconds of one call of ``fn``: ``launches`` calls queued back to back between
    two CUDA events, ``repeat`` times, after one untimed call (compiles, allocates).
    NumPy: ``perf_counter`` around the same loop."""
    fn()
    if not on_gpu(xp):
        times = []
        for _ in range(repeat):
            start = time.perf_counter()
            for _ in range(launches):
                fn()
            times.append((time.perf_counter() - start) / launches)
        return float(statistics.median(times))
    cuda = xp.cuda
    cuda.get_current_stream().synchronize()
    times = []
    for _ in range(repeat):
        start, end = cuda.Event(), cuda.Event()
        start.record()
        for _ in range(launches):
            fn()
        end.record()
        end.synchronize()
        times.append(cuda.get_elapsed_time(start, end) / 1e3 / launches)
    return float(statistics.median(times))


@dataclass(frozen=True)
class Streaming:
    """One element-wise kernel of the bandwidth table: ``build(xp, n, dtype)`` gives the
    arguments of ``call``; ``reads`` and ``writes`` count arrays of ``n`` elements (the
    least traffic: :func:`~syncbench.kernels.cuda_bench.bytes_moved`'s rule)."""

    name: str
    build: Callable[[Any, int, Any], tuple]
    call: Callable[..., Any]
    reads: int
    writes: int
    #: Elements read besides the arrays of ``n`` (``bias_add_``'s bias).
    extra_reads: int = 0

    def bytes(self, n: int, dtype: Any) -> int:
        return ((self.reads + self.writes) * n + self.extra_reads) * np.dtype(dtype).itemsize


def _arrays(xp: Any, n: int, dtype: Any, count: int) -> list[Any]:
    """``count`` arrays of ``n`` values in [-1, 1] (both signs: ReLU keeps half), made on
    the device by one element-wise kernel each (no host copy, no cuRAND)."""
    return [xp.linspace(-1.0 + i / 7, 1.0 - i / 11, n, dtype=dtype) for i in range(count)]


#: Bias columns of the ``bias_add_`` entry (a dense layer's output of n / 16 rows).
BIAS_COLUMNS = 16

BANDWIDTH_KERNELS: tuple[Streaming, ...] = (
    Streaming("sgd_momentum_", lambda xp, n, d: (*_arrays(xp, n, d, 3), 0.05, 0.9, 1e-4),
              lambda w, g, v, lr, mu, wd: cuda_ops.sgd_momentum_(w, g, v, lr, mu, wd),
              reads=3, writes=2),
    Streaming("axpy_", lambda xp, n, d: (*_arrays(xp, n, d, 2),),
              lambda y, x: cuda_ops.axpy_(y, 0.3, x), reads=2, writes=1),
    Streaming("relu_forward", lambda xp, n, d: (*_arrays(xp, n, d, 2),),
              lambda x, out: cuda_ops.relu_forward(x, out), reads=1, writes=1),
    Streaming("relu_backward", lambda xp, n, d: (*_arrays(xp, n, d, 3),),
              lambda dy, y, out: cuda_ops.relu_backward(dy, y, out), reads=2, writes=1),
    Streaming("add_relu", lambda xp, n, d: (*_arrays(xp, n, d, 2),),
              lambda a, b: cuda_ops.add_relu(a, b), reads=2, writes=1),
    Streaming("bias_add_", lambda xp, n, d: (_arrays(xp, n, d, 1)[0].reshape(
        n // BIAS_COLUMNS, BIAS_COLUMNS), _arrays(xp, BIAS_COLUMNS, d, 1)[0]),
              lambda y, b: cuda_ops.bias_add_(y, b, axis=1), reads=1, writes=1,
              extra_reads=BIAS_COLUMNS),
)


def elements(min_bytes: int, dtype: Any) -> int:
    """Elements of an array of at least ``min_bytes``, a multiple of :data:`BIAS_COLUMNS`."""
    item = np.dtype(dtype).itemsize
    n = -(-min_bytes // item)
    return -(-n // BIAS_COLUMNS) * BIAS_COLUMNS


def copy_seconds(xp: Any, nbytes: int, launches: int = LAUNCHES, repeat: int = REPEAT) -> float:
    """Seconds of one device-to-device copy of ``nbytes`` (``cudaMemcpyAsync`` on the current
    stream; NumPy: ``np.copyto``)."""
    src = xp.ones(nbytes, dtype=np.uint8)
    dst = xp.zeros(nbytes, dtype=np.uint8)
    if on_gpu(xp):
        runtime = xp.cuda.runtime

        def copy() -> None:
            runtime.memcpyAsync(dst.data.ptr, src.data.ptr, nbytes,
                                runtime.memcpyDeviceToDevice, xp.cuda.get_current_stream().ptr)
    else:
        def copy() -> None:
            np.copyto(dst, src)
    return event_seconds(copy, xp, launches, repeat)


def memory_peak_gb_s(xp: Any, device: int = 0) -> float | None:
    """2 x memory clock x bus width of ``device`` in GB/s, as the device reports them; None
    where it does not (or on the CPU)."""
    if not on_gpu(xp):
        return None
    runtime = xp.cuda.runtime
    try:  # cudaDevAttrMemoryClockRate (kHz) and cudaDevAttrGlobalMemoryBusWidth (bits)
        clock_khz = runtime.deviceGetAttribute(getattr(runtime, "cudaDevAttrMemoryClockRate", 36),
                                               device)
        bus_bits = runtime.deviceGetAttribute(
            getattr(runtime, "cudaDevAttrGlobalMemoryBusWidth", 37), device)
    except Exception:
        return None
    return 2.0 * clock_khz * 1e3 * bus_bits / 8 / 1e9 if clock_khz and bus_bits else None


def bandwidth(xp: Any, min_bytes: int = MIN_BYTES, dtype: Any = np.float32,
              launches: int = LAUNCHES, repeat: int = REPEAT,
              kernels: tuple[Streaming, ...] = BANDWIDTH_KERNELS) -> dict[str, Any]:
    """The bandwidth table: the copy (``copy``), then one row per kernel with its bytes,
    seconds, GB/s and ratio to the copy's GB/s (``rows``), and ``peak_gb_s``."""
    n = elements(min_bytes, dtype)
    copy_bytes = n * np.dtype(dtype).itemsize
    copy_s = copy_seconds(xp, copy_bytes, launches, repeat)
    copy_gb_s = 2 * copy_bytes / copy_s / 1e9  # read + write, as the kernels count
    rows = []
    for kernel in kernels:
        args = kernel.build(xp, n, dtype)
        seconds = event_seconds(lambda k=kernel, a=args: k.call(*a), xp, launches, repeat)
        moved = kernel.bytes(n, dtype)
        gb_s = moved / seconds / 1e9
        rows.append({"kernel": kernel.name, "elements": n, "array_bytes": copy_bytes,
                     "bytes": moved, "ms": seconds * 1e3, "gb_s": gb_s,
                     "vs_copy": gb_s / copy_gb_s})
        del args
        _free(xp)
    return {"dtype": np.dtype(dtype).name, "array_bytes": copy_bytes, "launches": launches,
            "timer": "CUDA events" if on_gpu(xp) else "perf_counter",
            "repeat": repeat, "copy": {"bytes": 2 * copy_bytes, "ms": copy_s * 1e3,
                                       "gb_s": copy_gb_s},
            "peak_gb_s": memory_peak_gb_s(xp), "rows": rows}


def _free(xp: Any) -> None:
    if on_gpu(xp):
        xp.get_default_memory_pool().free_all_blocks()


@dataclass(frozen=True)
class Gemm:
    """``op(A) @ op(B)`` as a layer calls it: ``a`` is (rows, cols) of the array in memory,
    used transposed when ``ta`` (likewise ``b``/``tb``)."""

    name: str
    a: tuple[int, int]
    b: tuple[int, int]
    ta: bool = False
    tb: bool = False

    def mnk(self) -> tuple[int, int, int]:
        m, k = self.a[::-1] if self.ta else self.a
        k2, n = self.b[::-1] if self.tb else self.b
        if k != k2:
            raise ValueError(f"{self.name}: inner sizes {k} and {k2} differ")
        return m, n, k


#: The model's GEMM forms (kernels/layers.py) at benchmark sizes, and a large square.
GEMMS: tuple[Gemm, ...] = (
    Gemm("dense forward x @ W (128x784 @ 784x512)", (128, 784), (784, 512)),
    Gemm("dense dW = x.T @ dy (784x128 @ 128x512)", (128, 784), (128, 512), ta=True),
    Gemm("conv dW = dy @ cols.T (6x200704 @ 200704x25)", (6, 200704), (25, 200704), tb=True),
    Gemm("square 8192", (8192, 8192), (8192, 8192)),
)


def gemm(xp: Any, shapes: tuple[Gemm, ...] = GEMMS, dtype: Any = np.float32,
         launches: int = 10, repeat: int = 3) -> list[dict[str, Any]]:
    """Per shape: TFLOP/s of ``xp.matmul`` as the layers call it and of ``cupy.cublas.gemm``
    on the same arrays (None on the CPU), and cuBLAS time / matmul time (1: the layers
    lose nothing to their call form)."""
    direct = _cublas_gemm(xp)
    rows = []
    for shape in shapes:
        rows.append(_gemm_row(xp, shape, dtype, direct, launches, repeat))
        _free(xp)
    return rows


def _gemm_row(xp: Any, shape: Gemm, dtype: Any, direct: Callable[..., Any] | None,
              launches: int, repeat: int) -> dict[str, Any]:
    m, n, k = shape.mnk()
    a = _arrays(xp, shape.a[0] * shape.a[1], dtype, 1)[0].reshape(shape.a)
    b = _arrays(xp, shape.b[0] * shape.b[1], dtype, 1)[0].reshape(shape.b)
    left, right = (a.T if shape.ta else a), (b.T if shape.tb else b)
    out = xp.empty((m, n), dtype=dtype)
    flops = 2.0 * m * n * k
    layer_s = event_seconds(lambda: xp.matmul(left, right, out=out), xp, launches, repeat)
    row = {"gemm": shape.name, "m": m, "n": n, "k": k, "matmul_ms": layer_s * 1e3,
           "matmul_tflop_s": flops / layer_s / 1e12,
           "cublas_ms": None, "cublas_tflop_s": None, "matmul_vs_cublas": None}
    if direct is not None:
        ta, tb = "T" if shape.ta else "N", "T" if shape.tb else "N"
        cublas_s = event_seconds(lambda: direct(ta, tb, a, b, out=out), xp, launches, repeat)
        row.update({"cublas_ms": cublas_s * 1e3, "cublas_tflop_s": flops / cublas_s / 1e12,
                    "matmul_vs_cublas": cublas_s / layer_s})
    return row


def _cublas_gemm(xp: Any) -> Callable[..., Any] | None:
    if not on_gpu(xp):
        return None
    try:
        from cupy import cublas  # lazy: the GPU run only
    except ImportError:
        return None
    return getattr(cublas, "gemm", None)


def format_bandwidth(table: dict[str, Any]) -> str:
    """The bandwidth table, with the copy and the peak it is set against."""
    peak = table.get("peak_gb_s")
    copy = table["copy"]
    lines = [f"bandwidth: {table['dtype']} arrays of {table['array_bytes'] / 1e9:.2f} GB, "
             f"{table.get('timer', 'CUDA events')} over {table['launches']} launches "
             f"(median of {table['repeat']})",
             f"device-to-device copy: {copy['gb_s']:.1f} GB/s (read + write)"
             + (f"; reported peak {peak:.1f} GB/s, copy at {copy['gb_s'] / peak:.0%} of it"
                if peak else ""),
             f"{'kernel':<16} {'GB moved':>9} {'ms':>9} {'GB/s':>9} {'vs copy':>8}"
             + (f" {'vs peak':>8}" if peak else "")]
    for row in table["rows"]:
        lines.append(f"{row['kernel']:<16} {row['bytes'] / 1e9:>9.2f} {row['ms']:>9.3f} "
                     f"{row['gb_s']:>9.1f} {row['vs_copy']:>8.2f}"
                     + (f" {row['gb_s'] / peak:>8.2f}" if peak else ""))
    return "\n".join(lines)


def format_gemm(rows: list[dict[str, Any]]) -> str:
    """The GEMM table: the layers' matmul against cuBLAS called directly."""
    lines = [f"{'gemm':<46} {'matmul TFLOP/s':>15} {'cuBLAS TFLOP/s':>15} {'ratio':>6}"]
    for row in rows:
        direct = row["cublas_tflop_s"]
        lines.append(f"{row['gemm']:<46} {row['matmul_tflop_s']:>15.2f} "
                     + (f"{direct:>15.2f} {row['matmul_vs_cublas']:>6.2f}" if direct
                        else f"{'-':>15} {'-':>6}"))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Command line: the bandwidth and GEMM tables on the current GPU."""
    parser = argparse.ArgumentParser(prog="python -m syncbench.kernels.gpu_measure",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--min-bytes", type=int, default=MIN_BYTES,
                        help="smallest array of the bandwidth table (default 1 GiB)")
    parser.add_argument("--launches", type=int, default=LAUNCHES)
    parser.add_argument("--repeat", type=int, default=REPEAT)
    parser.add_argument("--skip-gemm", action="store_true")
    parser.add_argument("--json", default=None, help="also write every figure to this file")
    config = parser.parse_args(argv)
    from syncbench.kernels.backend import BackendError, select_backend  # lazy: CuPy

    try:
        backend = select_backend("gpu")
    except BackendError as exc:
        print(f"gpu_measure: {exc}", file=sys.stderr)
        return 2
    xp = backend.xp
    figures: dict[str, Any] = {"device": backend.device}
    figures["bandwidth"] = bandwidth(xp, config.min_bytes, launches=config.launches,
                                     repeat=config.repeat)
    print(f"device: {backend.device}")
    print(format_bandwidth(figures["bandwidth"]), flush=True)
    if not config.skip_gemm:
        figures["gemm"] = gemm(xp)
        print(format_gemm(figures["gemm"]), flush=True)
    if config.json:
        with open(config.json, "w") as f:
            json.dump(figures, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
