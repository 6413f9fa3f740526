"""``syncbench overlap``: how much gradient communication overlap hides, side by side.

Launches ``syncbench train`` (one ``mpiexec`` each, run files in a temporary
directory) for SSGD ``--comm overlap`` (bucketed Iallreduce during backward),
SSGD ``--comm blocking`` (one Allreduce after backward) and OD-SGD (the
Iallreduce of step t overlaps the forward/backward of step t+1) on the same
model, ranks, epochs, batch size and seed, ``--repeats`` times in interleaved
order, reads the run files with :func:`syncbench.analysis.runfile.read_run`
and prints the medians over repeats in fixed columns.

Definitions (per step means over every rank and every step of the window;
the window skips the first ``W`` steps of every run, ``W`` being OD-SGD's
``--warmup-steps``, so all three rows cover the same steps and OD-SGD's row
is its delayed, overlapped regime):

* ``samples/s``: the run's ``/summary`` ``samples_per_s`` (whole run,
  OD-SGD's warm-up included).
* ``compute``, ``comm``, ``wait``: means of ``t_compute``, ``t_comm`` (time
  inside MPI calls that post or progress communication, including the
  ``Test`` polls between layers) and ``t_wait`` (exposed blocking in ``Wait``),
  in ms.
* ``T_block``: the blocking run's mean ``t_comm``, i.e. what one blocking
  Allreduce of the whole gradient (the same bytes) costs a step, skew between
  ranks included.
* ``hidden``: ``1 - (comm + wait) / T_block``, the fraction of the blocking
  reduction's cost that no longer sits on the step's critical path. Polling
  time counts as exposed: without an asynchronous progress thread the
  reduction advances only inside those calls. 0 for the blocking row by
  construction; negative when overlapping costs more than blocking.
* ratios: OD-SGD over each SSGD row, of samples/s, of ``wait`` and of
  ``comm + wait``.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
from pathlib import Path

import numpy as np

from syncbench.analysis.runfile import read_run
from syncbench.bench.launch import run_train

#: (row label, ``syncbench train`` flags selecting the strategy).
CONFIGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ssgd-overlap", ("--algorithm", "ssgd", "--comm", "overlap")),
    ("ssgd-blocking", ("--algorithm", "ssgd", "--comm", "blocking")),
    ("odsgd", ("--algorithm", "odsgd")),
)
METRICS = ("samples_per_s", "compute_ms", "comm_ms", "wait_ms", "accuracy")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench overlap``."""
    parser.add_argument("--np", type=int, default=4, help="ranks per run (default 4)")
    parser.add_argument("--model", default="mlp", help="model (default mlp)")
    parser.add_argument("--dataset", default="fashion-mnist",
                        help="dataset (default fashion-mnist)")
    parser.add_argument("--epochs", type=float, default=1.0, help="epochs per run (default 1)")
    parser.add_argument("--batch-size", type=int, default=64, help="per-rank batch (default 64)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per configuration, interleaved; medians are shown (default 3)")
    parser.add_argument("--warmup-steps", type=int, default=50,
                        help="OD-SGD warm-up steps; also the steps skipped by every "
                        "per-step mean (default 50)")
    parser.add_argument("--odsgd-flags", default="",
                        help="extra flags for the OD-SGD run, e.g. "
                        "'--local-lookahead on --lr-local 0.2'")
    parser.add_argument("--train-flags", default="",
                        help="extra flags for every run, e.g. '--synthetic-samples 4096'")
    parser.add_argument("--mpiexec", default=None,
                        help="launcher (default: $MPIEXEC, else mpiexec next to this Python)")
    parser.add_argument("--timeout", type=float, default=900,
                        help="seconds allowed per run (default 900)")


def run_metrics(path: Path, skip_steps: int) -> dict[str, float]:
    """Throughput, accuracy and per-step phase means (ms) of one run file."""
    run = read_run(path)

    def step_mean_ms(column: str) -> float:
        values = [cols[column][skip_steps:] for cols in run.ranks.values()]
        joined = np.concatenate(values) if values else np.zeros(0)
        return float(joined.mean()) * 1e3 if joined.size else float("nan")

    return {
        "samples_per_s": run.summary["samples_per_s"],
        "compute_ms": step_mean_ms("t_compute"),
        "comm_ms": step_mean_ms("t_comm"),
        "wait_ms": step_mean_ms("t_wait"),
        "accuracy": run.summary["final_accuracy"],
    }


def hidden_fraction(comm_ms: float, wait_ms: float, blocking_ms: float) -> float:
    """``1 - (comm + wait) / T_block`` (see the module docstring)."""
    return 1.0 - (comm_ms + wait_ms) / blocking_ms if blocking_ms > 0 else float("nan")


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("nan")


def format_table(med: dict[str, dict[str, float]], spread: dict[str, tuple[float, float]],
                 blocking_ms: float) -> list[str]:
    """The fixed-column table and the OD-SGD/SSGD ratio lines."""
    lines = [f"# {'algorithm':<14}{'samples/s':>11}{'(min':>9}{'max)':>9}{'compute ms':>12}"
             f"{'comm ms':>10}{'wait ms':>10}{'hidden':>9}{'accuracy':>10}"]
    for label, m in med.items():
        lo, hi = spread[label]
        hidden = hidden_fraction(m["comm_ms"], m["wait_ms"], blocking_ms)
        lines.append(f"  {label:<14}{m['samples_per_s']:>11.1f}{lo:>9.0f}{hi:>9.0f}"
                     f"{m['compute_ms']:>12.3f}{m['comm_ms']:>10.3f}{m['wait_ms']:>10.3f}"
                     f"{hidden:>9.3f}{m['accuracy']:>10.4f}")
    lines.append(f"# T_block (blocking Allreduce of the gradient, per step) = {blocking_ms:.3f} ms")
    lines.append(f"# {'ratio':<28}{'samples/s':>11}{'wait':>9}{'comm+wait':>11}")
    od = med["odsgd"]
    for base in ("ssgd-overlap", "ssgd-blocking"):
        b = med[base]
        lines.append(f"  {'odsgd / ' + base:<28}"
                     f"{_ratio(od['samples_per_s'], b['samples_per_s']):>11.3f}"
                     f"{_ratio(od['wait_ms'], b['wait_ms']):>9.3f}"
                     f"{_ratio(od['comm_ms'] + od['wait_ms'], b['comm_ms'] + b['wait_ms']):>11.3f}")
    return lines


def main(args: argparse.Namespace) -> int:
    """Run every configuration ``--repeats`` times and print the table; exit status."""
    common = ["--model", args.model, "--dataset", args.dataset, "--epochs", str(args.epochs),
              "--batch-size", str(args.batch_size), "--eval-every", "0",
              "--progress", "never", *shlex.split(args.train_flags)]
    odsgd_extra = ["--warmup-steps", str(args.warmup_steps), *shlex.split(args.odsgd_flags)]
    results: dict[str, list[dict[str, float]]] = {label: [] for label, _ in CONFIGS}
    print(f"# syncbench overlap: np={args.np} {args.model} {args.dataset} epochs={args.epochs} "
          f"batch={args.batch_size} repeats={args.repeats}; per-step means skip the first "
          f"{args.warmup_steps} steps", flush=True)
    with tempfile.TemporaryDirectory(prefix="syncbench-overlap-") as tmp:
        for repeat in range(args.repeats):
            for label, flags in CONFIGS:
                path = Path(tmp) / f"{label}-{repeat}.h5"
                extra = odsgd_extra if label == "odsgd" else []
                proc = run_train(args.np, [*flags, *common, *extra, "--out", str(path)],
                                 args.mpiexec, timeout=args.timeout, quiet=True)
                if proc.returncode != 0:
                    print(f"syncbench overlap: {label} failed (exit {proc.returncode}):\n"
                          f"{proc.stderr}", file=sys.stderr)
                    return proc.returncode or 1
                results[label].append(run_metrics(path, args.warmup_steps))
    med = {label: {k: statistics.median(r[k] for r in runs) for k in METRICS}
           for label, runs in results.items()}
    spread = {label: (min(r["samples_per_s"] for r in runs), max(r["samples_per_s"] for r in runs))
              for label, runs in results.items()}
    print("\n".join(format_table(med, spread, med["ssgd-blocking"]["comm_ms"])))
    return 0


if __name__ == "__main__":  # python -m syncbench.bench.overlap_bench (until the CLI wires it)
    _parser = argparse.ArgumentParser(prog="syncbench overlap", description=__doc__.split("\n")[0])
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
