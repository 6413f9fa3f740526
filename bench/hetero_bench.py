"""``syncbench hetero``: SSGD, Local SGD and Oscars side by side on heterogeneous ranks.

Launches one ``mpiexec -n NP syncbench train`` per algorithm (and per
repeat, interleaved so that machine noise hits every algorithm alike) with
the same ``--slowdown`` (default: the last rank 4x slower), the same sample
budget (``--epochs``) and the same target accuracy; reads the run files back
with :func:`syncbench.analysis.runfile.read_run` and prints one fixed-column
row per algorithm: median samples/s, final test accuracy, wall time to the
target accuracy, and the samples/s ratio against SSGD. This is the
experiment of ALGORITHMS.md, "Oscars" (fast ranks do more local work instead
of idling at the straggler's barrier).
"""

from __future__ import annotations

import argparse
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from syncbench.analysis.runfile import RunFileError
from syncbench.bench.launch import train_and_read


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench hetero``."""
    parser.add_argument("--np", type=int, default=4, help="MPI ranks (default 4)")
    parser.add_argument("--algorithms", default="ssgd,localsgd,oscars",
                        help="comma-separated algorithms (default ssgd,localsgd,oscars)")
    parser.add_argument("--slowdown", default=None,
                        help="per-rank slowdown factors (default: last rank 4x, e.g. 1,1,1,4)")
    parser.add_argument("--slowdown-schedule", default=None,
                        help="factor changes during training, e.g. '20s:3=1,2=3'")
    parser.add_argument("--model", default="mlp", help="model (default mlp)")
    parser.add_argument("--dataset", default="fashion-mnist",
                        help="dataset (default fashion-mnist)")
    parser.add_argument("--epochs", type=float, default=1.0,
                        help="sample budget in epochs, the same for all (default 1)")
    parser.add_argument("--target-accuracy", type=float, default=0.80,
                        help="test accuracy whose wall time is reported (default 0.80)")
    parser.add_argument("--eval-every", type=float, default=0.1,
                        help="evaluation interval in epochs (default 0.1)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs per algorithm, interleaved; medians are shown (default 3)")
    parser.add_argument("--train-args", default="",
                        help="extra flags for every 'syncbench train', written with '=', "
                        "e.g. --train-args='--period 2 --overlap' (every algorithm accepts "
                        "every algorithm's flags)")
    parser.add_argument("--out-dir", default=None,
                        help="keep the run files here (default: a temporary directory)")
    parser.add_argument("--timeout", type=float, default=600,
                        help="seconds allowed for each run (default 600)")


@dataclass
class Result:
    """One run's figures, read back from its run file."""

    samples_per_s: float
    final_accuracy: float
    time_to_target_s: float
    wall_s: float


def train_args(args: argparse.Namespace, algorithm: str) -> list[str]:
    """The ``syncbench train`` flags of one run."""
    slowdown = args.slowdown or ",".join(["1"] * (args.np - 1) + ["4"])
    flags = ["--algorithm", algorithm, "--model", args.model, "--dataset", args.dataset,
             "--epochs", str(args.epochs), "--eval-every", str(args.eval_every),
             "--target-accuracy", str(args.target_accuracy), "--slowdown", slowdown]
    if args.slowdown_schedule:
        flags += ["--slowdown-schedule", args.slowdown_schedule]
    return flags + shlex.split(args.train_args)


def run_one(args: argparse.Namespace, algorithm: str, out: Path) -> Result:
    """Train once under mpiexec and read the figures back from the run file."""
    s = train_and_read(args.np, train_args(args, algorithm), out, timeout=args.timeout).summary
    return Result(s["samples_per_s"], s["final_accuracy"], s["time_to_target_s"], s["wall_s"])


def _median(values: list[float]) -> float:
    """Median of the finite values; NaN if there are none."""
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def format_table(results: dict[str, list[Result]], target: float) -> str:
    """Fixed-column table of medians, with the samples/s ratio against SSGD."""
    medians = {alg: (_median([r.samples_per_s for r in rs]),
                     _median([r.final_accuracy for r in rs]),
                     _median([r.time_to_target_s for r in rs]),
                     sum(not math.isnan(r.time_to_target_s) for r in rs), len(rs))
               for alg, rs in results.items()}
    base = medians.get("ssgd", (math.nan,))[0]
    lines = [f"# {'algorithm':<10} {'samples/s':>10} {'final acc':>10} "
             f"{f'to {target:.2f} [s]':>14} {'reached':>8} {'x ssgd':>7}"]
    for alg, (sps, acc, ttt, hit, n) in medians.items():
        ratio = f"{sps / base:7.2f}" if base and not math.isnan(base) else f"{'-':>7}"
        ttt_text = f"{ttt:14.2f}" if not math.isnan(ttt) else f"{'not reached':>14}"
        lines.append(f"  {alg:<10} {sps:10.1f} {acc:10.4f} {ttt_text} {f'{hit}/{n}':>8} {ratio}")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    """Run every algorithm ``--repeats`` times (interleaved), print the table; 0 on success."""
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if args.np < 1 or args.repeats < 1 or not algorithms:
        print("syncbench hetero: --np and --repeats must be >= 1 and --algorithms non-empty",
              file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="syncbench-hetero-") as tmp:
        out_dir = Path(args.out_dir or tmp)
        out_dir.mkdir(parents=True, exist_ok=True)
        results: dict[str, list[Result]] = {a: [] for a in algorithms}
        try:
            for repeat in range(args.repeats):
                for alg in algorithms:
                    out = out_dir / f"{alg}-np{args.np}-r{repeat}.h5"
                    results[alg].append(run_one(args, alg, out))
                    r = results[alg][-1]
                    print(f"  run {repeat + 1}/{args.repeats} {alg:<10} "
                          f"{r.samples_per_s:10.1f} samples/s  accuracy {r.final_accuracy:.4f}"
                          f"  to target {r.time_to_target_s:.2f}s", flush=True)
        except (RuntimeError, RunFileError, subprocess.TimeoutExpired) as exc:
            print(f"syncbench hetero: {exc}", file=sys.stderr)
            return 1
    slowdown = args.slowdown or ",".join(["1"] * (args.np - 1) + ["4"])
    print(f"# syncbench hetero: np={args.np} {args.model} {args.dataset} epochs={args.epochs} "
          f"slowdown={slowdown} repeats={args.repeats} (medians) {args.train_args}".rstrip())
    print(format_table(results, args.target_accuracy))
    return 0


if __name__ == "__main__":  # python -m syncbench.bench.hetero_bench
    _parser = argparse.ArgumentParser(prog="syncbench hetero", description=__doc__)
    add_arguments(_parser)
    sys.exit(main(_parser.parse_args()))
