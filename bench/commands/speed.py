"""``syncbench speed``: single-process training-step throughput of each model.

Times forward + backward + momentum update of one process (no MPI) on random
inputs of the model's shape, ``--steps`` steps per repeat, and prints the
median over ``--repeats`` in fixed columns, so later changes can be compared
against it. Run it with ``OMP_NUM_THREADS=1`` for the per-rank figure.

Each row also gives the step's FLOPs, counted from the layers (the GEMMs of
forward and backward, a multiply-add being 2 FLOP, plus 4 FLOP per parameter
for the update; element-wise layers are not counted), the rate they make at
the median (FLOP per step x steps per second) and that rate's fraction of
the GEMM rate. The GEMM rate is measured in the same process before the
models, with the same threads and dtype: NumPy's BLAS on one ``--gemm-size``
square product, the best of 5. A nominal peak of one core from
``/proc/cpuinfo`` (vector width, FMA, clock) is printed beside it as an
estimate only; the fraction's denominator stays the measured GEMM.
``--compress CODEC,...`` adds, for each model, the codecs' encode and decode of the
step's gradient, each made at once after a step's forward and backward, their share of
it, and a plain copy of the gradient's share timed the same way (the floor of one read
and one write). ``--out FILE.json`` writes every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from syncbench.algorithms.codecs import parse_codec
from syncbench.analysis.repeats import column_spread
from syncbench.bench.files import write_atomic
from syncbench.bench.flags import add_json_out, check_json_out, positive_int, renamed
from syncbench.bench.micro.codecs import print_step_shares, step_shares
from syncbench.bench.micro.output import check_writable_parent
from syncbench.bench.micro.speed import (
    GEMM_REPEATS,
    HEADER,
    blas_name,
    gemm_rate,
    model_step_flops,
    peak_line,
    read_peak_estimate,
    step_throughput,
)
from syncbench.kernels import cpu_native
from syncbench.kernels.zoo import split_models

HELP = "single-process training-step throughput of the models"



def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench speed``."""
    renamed(parser, ("--models",), "--model", dest="models", default="mlp,lenet",
            metavar="MODEL,...", help="models, comma-separated")
    parser.add_argument("--batch-size", type=int, default=64, help="batch per step")
    parser.add_argument("--steps", type=int, default=50, help="steps per repeat")
    parser.add_argument("--repeats", type=int, default=5, help="repeats; the median is shown")
    parser.add_argument("--dtype", default="float32", choices=("float32", "float64"),
                        help="parameter and activation precision")
    parser.add_argument("--gemm-size", type=positive_int, default=1024, metavar="N",
                        help=f"the reference GEMM is N x N times N x N in --dtype, best of "
                        f"{GEMM_REPEATS}")
    parser.add_argument("--compress", default="", metavar="CODEC,...",
                        help="also time these codecs' encode + decode of each model's "
                        "gradient beside its step (fp16, bf16, int8, powersgd:R, topk:D, "
                        "randk:D) and print their share of the step's compute")
    add_json_out(parser, "every figure")


def run(args: argparse.Namespace) -> int:
    """Body of ``syncbench speed``: time each model of ``--model``; one fixed-column row per
    model."""
    if args.json:
        try:
            check_json_out(args)
            check_writable_parent("--out", args.json)
        except ValueError as exc:
            print(f"syncbench speed: {exc}", file=sys.stderr)
            return 2
    specs = [spec for spec in args.compress.split(",") if spec]
    try:
        for spec in specs:
            parse_codec(spec)
    except ValueError as exc:
        print(f"syncbench speed: --compress: {exc}", file=sys.stderr)
        return 2
    threads = os.environ.get("OMP_NUM_THREADS", "unset")
    print(f"# syncbench speed: batch {args.batch_size}, {args.steps} steps x {args.repeats} "
          f"repeats, {args.dtype}, OMP_NUM_THREADS={threads}")
    gemm, gemm_s = gemm_rate(args.gemm_size, args.dtype)
    blas = blas_name()
    n = args.gemm_size
    print(f"# GEMM (measured, this process): numpy.matmul {n}x{n}x{n} {args.dtype}"
          f"{f' ({blas})' if blas else ''}, best of {GEMM_REPEATS}: {gemm / 1e9:.2f} GFLOP/s; "
          "'of GEMM' is each model's GFLOP/s over it")
    peak = read_peak_estimate(args.dtype)
    print(peak_line(peak, args.dtype))
    print(f"# CPU convolutions: {cpu_native.status()} (kernels/cpu_native.py)")
    print("# MFLOP/step: forward and backward GEMMs + momentum update (kernels/flops.py)")
    print(HEADER)
    rows = []
    for name in split_models(args.models):
        rates = step_throughput(name, args.batch_size, args.steps, args.repeats, args.dtype)
        med, low, high = column_spread(rates)
        flops = model_step_flops(name, args.batch_size)
        achieved = flops.total * med / args.batch_size
        print(f"  {name:<8}{flops.params:>10}{med:>20.1f}{low:>12.1f}{high:>12.1f}"
              f"{1000 * args.batch_size / med:>10.3f}{flops.total / 1e6:>12.3f}"
              f"{achieved / 1e9:>10.3f}{achieved / gemm:>9.4f}", flush=True)
        rows.append({"model": name, "params": flops.params, "samples_per_s": rates,
                     "median_samples_per_s": med, "ms_per_step": 1000 * args.batch_size / med,
                     "flops": flops.as_dict(), "flops_per_s": achieved,
                     "fraction_of_gemm": achieved / gemm})
    shares = []
    if specs:
        shares = step_shares(split_models(args.models), specs, args.batch_size,
                             max(1, args.steps // 5), args.repeats)
        print_step_shares(shares, args.repeats)
    if args.json:
        result = {"batch_size": args.batch_size, "steps": args.steps, "repeats": args.repeats,
                  "dtype": args.dtype, "omp_num_threads": threads,
                  "cpu_convolutions": cpu_native.status(),
                  "gemm": {"n": n, "repeats": GEMM_REPEATS, "best_s": gemm_s,
                           "flops_per_s": gemm, "blas": blas},
                  "peak_estimate": peak.as_dict() if not isinstance(peak, str) else None,
                  "peak_estimate_missing": peak if isinstance(peak, str) else "",
                  "models": rows,
                  "codecs": [{"model": r.model, "codec": r.spec, "wire_bytes": r.wire_bytes,
                              "compute_s": r.compute, "codec_s": r.codec,
                              "share": r.shares, "copy_s": r.copy,
                              "copy_share": r.copy_shares} for r in shares]}
        write_atomic(args.json, json.dumps(result, indent=1).encode())
        print(f"# figures -> {args.json}", flush=True)
    return 0
