"""The ``syncbench`` command line (also ``python -m syncbench``).

Each sub-command lives in its own module, which provides ``add_arguments``
(its flags) and ``main`` (its body). Only the module of the command being
run is imported, so ``syncbench report`` works without MPI and ``--help``
is instant. Commands marked *passthrough* hand flags they do not know to
``syncbench train`` (one set of training flags for every launcher).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A sub-command: where its flags and body live, and its help."""

    module: str
    add: str
    run: str
    help: str
    passthrough: bool = False


COMMANDS: dict[str, Command] = {
    "train": Command("syncbench.bench.options", "add_train_arguments", "run_train_command",
                     "one training run (launch under mpiexec -n N)"),
    "compare": Command("syncbench.bench.compare", "add_arguments", "main",
                       "the same training flags under several algorithms, then a table",
                       passthrough=True),
    "sweep": Command("syncbench.bench.sweep", "add_arguments", "main",
                     "strong or weak scaling sweep over rank counts", passthrough=True),
    "report": Command("syncbench.analysis.report", "add_report_arguments", "report_main",
                      "tables (and --plots) from run files"),
    "trace": Command("syncbench.analysis.trace", "add_trace_arguments", "trace_main",
                     "Chrome/Perfetto trace of every rank's phases"),
    "recover": Command("syncbench.bench.checkpoint", "add_recover_arguments", "recover_main",
                       "rebuild a partial run file from the rows a crashed run flushed"),
    "comm": Command("syncbench.bench.commbench", "add_arguments", "main",
                    "OSU-style communication micro-benchmarks (under mpiexec)"),
    "ssgd-comm": Command("syncbench.bench.ssgd_comm", "add_arguments", "main",
                         "SSGD's time inside MPI per step vs a bare Allreduce (under mpiexec)"),
    "speed": Command("syncbench.bench.speed", "add_arguments", "main",
                     "single-process training-step throughput of the models"),
    "overlap": Command("syncbench.bench.overlap_bench", "add_arguments", "main",
                       "SSGD (overlap, blocking) vs OD-SGD: throughput and hidden communication"),
    "hetero": Command("syncbench.bench.hetero_bench", "add_arguments", "main",
                      "SSGD, Local SGD and Oscars side by side on heterogeneous ranks"),
    "asgd-bench": Command("syncbench.bench.asgd_bench", "add_arguments", "main",
                          "ASGD vs SSGD throughput with a slow rank"),
    "peers": Command("syncbench.bench.peers_bench", "add_arguments", "main",
                     "ours vs PyTorch DDP / PeriodicModelAverager, and SSGD vs a bare Allreduce"),
    "data": Command("syncbench.bench.data_cli", "add_arguments", "main",
                    "dataset files: info (what is found where) or fetch (download)"),
}


def build_parser(selected: str | None = None) -> argparse.ArgumentParser:
    """The parser; only ``selected``'s module is imported to add its flags."""
    parser = argparse.ArgumentParser(
        prog="syncbench",
        description="Benchmark synchronization strategies of data-parallel training under "
        "MPI: train (under mpiexec), compare, sweep, report, trace.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        module = importlib.import_module(command.module) if name == selected else None
        doc = (module.__doc__ or "").strip() if module else ""
        sp = sub.add_parser(name, help=command.help, description=doc or command.help,
                            formatter_class=argparse.RawDescriptionHelpFormatter)
        if module is not None:
            getattr(module, command.add)(sp)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    selected = argv[0] if argv and argv[0] in COMMANDS else None
    parser = build_parser(selected)
    if selected is not None and COMMANDS[selected].passthrough:
        args, extra = parser.parse_known_args(argv)
    else:
        args, extra = parser.parse_args(argv), None
    command = COMMANDS[args.command]
    body = getattr(importlib.import_module(command.module), command.run)
    result = body(args, extra) if command.passthrough else body(args)
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
