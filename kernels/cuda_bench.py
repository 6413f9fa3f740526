"""``python -m syncbench.kernels.cuda_bench``: the CUDA kernels timed against NumPy.

Every :data:`syncbench.kernels.cuda_cases.CASES` entry at benchmark size is
run through its NumPy reference (:data:`syncbench.kernels.ops.REFERENCES`)
and through its kernel (:mod:`syncbench.kernels.cuda_ops`); the table gives
both medians, the speedup, the least memory traffic of the operation
(:func:`bytes_moved`) over the kernel's time (the effective bandwidth at the
model's sizes, most of whose arrays fit in the GPU's L2: the HBM figures are
:mod:`syncbench.kernels.gpu_measure`'s, on 1 GiB arrays beside a
device-to-device copy) and whether the outputs agree by the
cases' rules (bit for bit, or within
:func:`~syncbench.kernels.cuda_cases.tolerance`). The kernel's time is taken
with CUDA events around ``repeat`` launches queued back to back
(:func:`~syncbench.kernels.gpu_measure.event_seconds`), not per call with a
stream synchronization, whose ~7 µs launch cost would dominate small calls. The tests run the same
code on NumPy arrays through the host emulator, without a GPU. CuPy is
imported only when no array module is given (the GPU run).
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from syncbench.kernels import cuda_ops, ops
from syncbench.kernels.cuda_cases import CASES, run_case, tolerance


def _median_seconds(fn: Callable[[], Any], repeat: int, sync: Callable[[], None]) -> float:
    fn()
    sync()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def benchmark(
    dtype: Any = np.float32,
    repeat: int = 10,
    seed: int = 0,
    large: bool = True,
    xp: Any = None,
) -> list[dict[str, Any]]:
    """Time every :data:`CASES` entry: NumPy reference vs CUDA kernel.

    Returns rows with ``case``, ``numpy_ms``, ``cuda_ms`` (medians; the GPU
    time is one call's of ``repeat`` queued back to back between CUDA events), ``bytes`` (the
    least memory traffic of the operation, :func:`bytes_moved`), ``cuda_gb_s``
    and ``numpy_gb_s`` (``bytes`` over the time: the effective bandwidth, to
    compare with the device's memory peak), ``max_abs_diff``,
    ``max_rel_diff`` (relative to the largest output magnitude), ``exact``
    (:meth:`~syncbench.kernels.cuda_cases.Case.is_exact`) and ``ok``
    (bit-identical if exact, else within :func:`tolerance`). ``xp`` is CuPy
    by default; NumPy (with the host emulator as launcher, small sizes) lets
    the tests run this code without a GPU.
    """
    if xp is None:
        import cupy as xp  # lazy: only the GPU run has CuPy
    from syncbench.kernels.gpu_measure import event_seconds  # imports cuda_ops, like this

    on_gpu = xp.__name__ == "cupy"
    sync = xp.cuda.get_current_stream().synchronize if on_gpu else (lambda: None)
    to_host = xp.asnumpy if on_gpu else np.asarray
    dtype = np.dtype(dtype)
    rows = []
    for case in CASES:
        host = case.build(np.random.default_rng(seed), dtype, large)
        device = tuple(xp.asarray(a) if isinstance(a, np.ndarray) else a for a in host)
        reference, kernel = ops.REFERENCES[case.op], getattr(cuda_ops, case.op)
        expected = run_case(reference, _copies(host))
        got = run_case(kernel, _copies(device))
        diff, rel = _differences(expected, [to_host(g) for g in got])
        numpy_s = _median_seconds(lambda r=reference, a=host: r(*a), repeat, lambda: None)
        cuda_s = (event_seconds(lambda k=kernel, a=device: k(*a), xp, launches=repeat, repeat=3)
                  if on_gpu else
                  _median_seconds(lambda k=kernel, a=device: k(*a), repeat, sync))
        exact = case.is_exact(large)
        ok = diff == 0.0 if exact else rel <= tolerance(dtype, large)
        moved = bytes_moved(reference, host)
        rows.append({"case": case.name, "numpy_ms": numpy_s * 1e3, "cuda_ms": cuda_s * 1e3,
                     "bytes": moved, "cuda_gb_s": _gb_per_s(moved, cuda_s),
                     "numpy_gb_s": _gb_per_s(moved, numpy_s),
                     "max_abs_diff": diff, "max_rel_diff": rel, "exact": exact, "ok": ok})
    return rows


def bytes_moved(reference: Callable[..., Any], args: tuple) -> int:
    """Least bytes an operation moves: every array argument read once, every array it
    returns and every argument it changes in place written once.

    Found by running the NumPy ``reference`` on copies of ``args``. Reused reads
    (im2col's overlapping windows) are not counted again: this is the traffic an
    ideal kernel needs, so bytes / time is the effective bandwidth to set against
    the memory peak.
    """
    before = _copies(args)
    after = _copies(args)
    result = reference(*after)
    returned = list(result) if isinstance(result, tuple) else [result]
    moved = sum(a.nbytes for a in before if isinstance(a, np.ndarray))
    moved += sum(r.nbytes for r in returned if isinstance(r, np.ndarray) and r.ndim)
    moved += sum(b.nbytes for a, b in zip(before, after)
                 if isinstance(a, np.ndarray) and not np.array_equal(a, b, equal_nan=True))
    return int(moved)


def _gb_per_s(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else math.inf


def _copies(args: tuple) -> tuple:
    return tuple(a.copy() if hasattr(a, "copy") else a for a in args)


def _differences(expected: list[Any], got: list[Any]) -> tuple[float, float]:
    """Largest absolute difference, and largest one relative to the output's magnitude."""
    worst_abs = worst_rel = 0.0
    for e, g in zip(expected, got):
        e = np.asarray(e, dtype=np.float64)
        diff = float(np.max(np.abs(np.asarray(g, dtype=np.float64) - e), initial=0.0))
        scale = float(np.max(np.abs(e), initial=0.0)) or 1.0
        worst_abs, worst_rel = max(worst_abs, diff), max(worst_rel, diff / scale)
    return worst_abs, worst_rel


def format_table(rows: list[dict[str, Any]]) -> str:
    """The benchmark rows as a fixed-width table."""
    lines = [f"{'kernel':<26} {'numpy ms':>10} {'cuda ms':>10} {'speedup':>9} {'MB':>8} "
             f"{'cuda GB/s':>10} {'max|diff|':>10} {'check':>6}"]
    for row in rows:
        speedup = row["numpy_ms"] / row["cuda_ms"] if row["cuda_ms"] > 0 else math.inf
        check = ("exact" if row.get("exact") else "tol") if row.get("ok", True) else "FAIL"
        lines.append(f"{row['case']:<26} {row['numpy_ms']:>10.3f} {row['cuda_ms']:>10.3f} "
                     f"{speedup:>8.1f}x {row.get('bytes', 0) / 1e6:>8.1f} "
                     f"{row.get('cuda_gb_s', math.nan):>10.1f} {row['max_abs_diff']:>10.2e} "
                     f"{check:>6}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python -m syncbench.kernels.cuda_bench``: kernel timings against the NumPy references."""
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    config = parser.parse_args(argv)
    rows = benchmark(config.dtype, config.repeat)
    print(format_table(rows))
    if config.json:
        import json  # lazy: only --json

        with open(config.json, "w") as f:
            json.dump({"dtype": config.dtype, "repeat": config.repeat,
                       "rows": [{k: (v.item() if hasattr(v, "item") else v)
                                 for k, v in row.items()} for row in rows]}, f, indent=1)
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
