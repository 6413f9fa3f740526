"""The ``syncbench`` command line (also ``python -m syncbench``).

Sub-commands: ``train`` (one run, under ``mpiexec``), ``compare`` (one
``mpiexec`` per algorithm, then a table), ``report`` (tables from run files),
``speed`` (single-process step throughput) and ``data`` (dataset files).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _train(args: argparse.Namespace) -> int:
    from mpi4py import MPI  # noqa: PLC0415 - only the MPI commands need it

    from syncbench.bench.train import run_training  # noqa: PLC0415

    run_training(args, MPI.COMM_WORLD)
    return 0


def _report(args: argparse.Namespace) -> int:
    from syncbench.analysis.report import format_report, report_rows  # noqa: PLC0415
    from syncbench.analysis.runfile import RunFileError  # noqa: PLC0415

    try:
        rows = report_rows(args.runs)
    except RunFileError as exc:
        print(f"syncbench report: {exc}", file=sys.stderr)
        return 2
    print(format_report(rows, args.format))
    return 0


def _recover(args: argparse.Namespace) -> int:
    from syncbench.bench.checkpoint import recover  # noqa: PLC0415

    try:
        summary = recover(args.run, overwrite=args.overwrite)
    except (OSError, ValueError, KeyError) as exc:
        print(f"syncbench recover: {exc}", file=sys.stderr)
        return 2
    print(f"{args.run}: partial run rebuilt (complete=False), "
          f"{summary['samples_per_s']:.1f} samples/s over {summary['wall_s']:.2f} s")
    return 0


def _speed(args: argparse.Namespace) -> int:
    from syncbench.bench.speed import main as speed_main  # noqa: PLC0415

    return speed_main(args)


def _compare(args: argparse.Namespace, extra: list[str]) -> int:
    from syncbench.bench.compare import main as compare_main  # noqa: PLC0415

    return compare_main(args, extra)


def _data(args: argparse.Namespace) -> int:
    from syncbench.bench.data import DatasetError, fetch_dataset, load_dataset  # noqa: PLC0415

    try:
        if args.action == "fetch":
            for path in fetch_dataset(args.name, args.dest):
                print(path)
        else:
            ds = load_dataset(args.name, args.data_dir)
            print(f"{ds.name}: train {ds.train_x.shape} test {ds.test_x.shape} "
                  f"classes {ds.num_classes} from {ds.source}")
    except DatasetError as exc:
        print(f"syncbench data: {exc}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="syncbench",
        description="Benchmark synchronization strategies of data-parallel training under MPI.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    from syncbench.bench.options import add_train_arguments  # noqa: PLC0415

    train = sub.add_parser(
        "train", help="one training run (launch under mpiexec -n N)",
        description="Train one model with one synchronization strategy on every MPI rank "
        "and write the per-rank, per-step timings to an HDF5 run file. "
        "Example: mpiexec -n 4 syncbench train --algorithm ssgd --model mlp "
        "--dataset fashion-mnist --epochs 1 --out run.h5",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_train_arguments(train)

    compare = sub.add_parser(
        "compare", help="run several algorithms (one mpiexec each) and print a comparison",
        description="Launch one mpiexec per algorithm with the same flags, then print the "
        "comparison table. Flags it does not know are passed to syncbench train.",
    )
    compare.add_argument("--np", type=int, default=4, help="ranks per run (default 4)")
    compare.add_argument("--algorithms", default="ssgd,asgd,odsgd,oscars",
                         help="comma-separated algorithms (default ssgd,asgd,odsgd,oscars; "
                         "those not available are skipped with a note)")
    compare.add_argument("--out-dir", default="runs", help="where run files go (default runs)")
    compare.add_argument("--mpiexec", default=None,
                         help="launcher (default: $MPIEXEC, else mpiexec next to this Python)")
    compare.add_argument("--format", default="md", choices=("md", "csv", "json"))

    report = sub.add_parser("report", help="summary table of run files")
    report.add_argument("runs", nargs="+", metavar="RUN.h5")
    report.add_argument("--format", default="md", choices=("md", "csv", "json"),
                        help="output format (default md)")

    recover = sub.add_parser(
        "recover", help="rebuild a partial run file from the rows a crashed run flushed",
        description="After a job died, rebuild RUN.h5 (marked complete=False) from the "
        "per-rank row checkpoints in RUN.h5.parts/ (see --flush-every).",
    )
    recover.add_argument("run", metavar="RUN.h5")
    recover.add_argument("--overwrite", action="store_true")

    speed = sub.add_parser(
        "speed", help="single-process training-step throughput (samples/s)",
        description="Times forward+backward+update of each model in one process "
        "(no MPI), median over repeats, and prints one fixed-column row per model.",
    )
    speed.add_argument("--models", default="mlp,lenet")
    speed.add_argument("--batch-size", type=int, default=64)
    speed.add_argument("--steps", type=int, default=50, help="steps per repeat (default 50)")
    speed.add_argument("--repeats", type=int, default=5, help="repeats (default 5)")
    speed.add_argument("--dtype", default="float32", choices=("float32", "float64"))

    data = sub.add_parser("data", help="dataset files: info or fetch")
    data.add_argument("action", choices=("info", "fetch"))
    data.add_argument("name")
    data.add_argument("--data-dir", default=None, help="for info: where to look")
    data.add_argument("--dest", default=".", help="for fetch: target directory")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] == "compare":
        args, extra = parser.parse_known_args(argv)
        return _compare(args, extra)
    args = parser.parse_args(argv)
    handlers = {"train": _train, "report": _report, "recover": _recover, "speed": _speed,
                "data": _data}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
