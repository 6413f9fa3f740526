"""``syncbench report``: tables of run files, as Markdown, CSV or JSON, and plots.

The summary table has one row per run file, with what the run recorded (its
``/summary`` and root attributes; nothing is recomputed there). The tables
after it add the time per phase, hidden communication, stragglers, accuracy,
speedup and efficiency; ``--by KEYS`` folds repeats into one row per group
(median and min-max), ``--plots DIR`` writes the plots. Every Markdown table
is headed by the machine context (cores, ranks per core, oversubscribed or
loaded runs) and leads with the sync share (comm + wait); the summary shows
time to target beside the evaluation interval that bounds its resolution, and
"diverged" / "overlapped" instead of ratios that must not be read. The
columns' definitions: docs/USAGE.md, "What the tables mean". JSON rows start
with ``path`` and the summary's keys, in a fixed order; new keys only come
after them (``machine``: the context line of the row's runs). Every column,
its format, header and footnote is one entry of the column registry
(analysis/columns.py), which the Markdown, CSV and JSON outputs print from.
``--format steps`` and ``--format eval`` write instead one tidy table of
every rank's steps or of every evaluation (CSV on stdout or ``-o FILE``,
Parquet for ``-o FILE.parquet``).

An incomplete run (``complete`` False: it did not consume its sample budget)
is read with a warning on stderr and noted with its reason, "stopped by
SIGTERM" (``stopped_by``: a signal stopped it at a step boundary) or "partial
(recovered)" (rebuilt by ``syncbench recover``); it gets no speedup,
efficiency or hidden communication ("-"), is no baseline, and a ``--by``
group with one gets none either.

A results file (the runner's ``results.json``, a sweep's ``manifest.json``) or a
folder of runs is taken wherever a run file is (:mod:`.inputs`): a folder stands
for its results file, else its ``*.h5``; a results file's runs are reported, after
the runner's own tables reprinted from what it recorded (:func:`runner_tables`:
time to target and samples/s against the baseline, the heterogeneous table, the
parity table), or a scaling scenario's (a sweep's) scaling table.
``-o FILE`` writes any format to FILE instead of stdout, whole or not at all.

``--compare A B`` compares two sets of runs instead (two results files, folders
of run files or globs): per label and configuration the ratio of medians B/A
and a Mann-Whitney U test, flagging significant changes beyond a threshold
(``--threshold``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from typing import Any

from syncbench.analysis.collectives import collective_rows, format_collectives_md
from syncbench.analysis.columns import PATH_KEY
from syncbench.analysis.compare import add_compare_arguments, compare_main
from syncbench.analysis.context import format_contexts, machine_context
from syncbench.analysis.data_record import format_data_md
from syncbench.analysis.inputs import InputError, expand
from syncbench.analysis.output_paths import OutputError, check_output_dir, check_output_file
from syncbench.analysis.plot_style import (
    add_plot_arguments,
    plot_flags_problem,
    plot_output,
    require_matplotlib,
)
from syncbench.analysis.plots import write_plots
from syncbench.analysis.report import (
    FORMATS,
    by_keys,
    check_by_keys,
    format_tables,
    load_runs,
    report_tables,
    runner_tables,
)
from syncbench.analysis.runfile import Run, RunFileError
from syncbench.analysis.steps import TABLES, write_table
from syncbench.analysis.tables import table_rows
from syncbench.analysis.targets import loss_target_problem, target_problem
from syncbench.analysis.trace import parse_steps
from syncbench.bench.files import WriteError, write_atomic
from syncbench.bench.flags import renamed

HELP = "tables (and --plots) from run files"


def _steps_window(text: str) -> str:
    """``--timeline-steps``: ``A:B``, ``A:`` or ``:B``, checked while parsing so that the
    error names the flag the user typed."""
    try:
        parse_steps(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected A:B, A: or :B (steps A <= step < B), got {text!r}") from None
    return text


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``syncbench report``."""
    parser.add_argument("runs", nargs="+", metavar="RUN.h5",
                        help="run files (syncbench/1), results files (results.json, "
                        "manifest.json: the runner's tables, then its runs') or folders of "
                        "runs; with --compare: the two sets A B")
    parser.add_argument("--format", default="md", choices=(*FORMATS, *TABLES),
                        help="output format (default md); steps: one tidy row per rank and "
                        "step of every run, eval: one per evaluation (CSV, see -o)")
    renamed(parser, ("--output",), "-o", "--out", dest="output", default=None, metavar="FILE",
                        help="write the output to FILE instead of stdout, whole or not at "
                        "all (any --format; steps/eval: Parquet when FILE ends in .parquet, "
                        "needs pyarrow)")
    parser.add_argument("--by", default=None, metavar="KEY,...",
                        help="aggregate repeats: one row per distinct value of these keys "
                        "(columns such as algorithm, world_size, model, or any train flag "
                        "such as comm), median with min/max")
    parser.add_argument("--plots", default=None, metavar="DIR",
                        help="also write the figures to DIR: headline (time to target and "
                        "samples/s against the baseline), scaling, convergence (needs "
                        "matplotlib: pip install syncbench[plot])")
    add_plot_arguments(parser)
    parser.add_argument("--series", default=None, metavar="KEY,...",
                        help="more keys that split scaling series (a series already shares "
                        "algorithm, model, dataset, MPI library, backend, dtype, batch, "
                        "slowdowns, the strategy's flags and the budget; the --by keys "
                        "split it too)")
    parser.add_argument("--target-accuracy", type=float, default=None, metavar="X",
                        help="recompute time to target for this test accuracy "
                        "(default: the runs' own --target-accuracy)")
    parser.add_argument("--target-loss", type=float, default=None, metavar="NATS",
                        help="recompute time to target for this validation loss in nats per "
                        "token (language-model runs; default: the runs' own --target-loss)")
    parser.add_argument("--timeline-steps", default=None, metavar="A:B", type=_steps_window,
                        help="steps shown in the per-run timeline plots (--per-run-plots; "
                        "default: up to 8 "
                        "steps from the middle of each run)")
    parser.add_argument("--per-rank", action="store_true",
                        help="Markdown: add one per-rank table per run")
    add_compare_arguments(parser)


def _output_problem(args: argparse.Namespace) -> str | None:
    """Why ``-o`` or ``--plots`` cannot be written (checked before any run file is read),
    else None."""
    try:
        if getattr(args, "output", None):
            check_output_file("-o/--out", args.output)
        if getattr(args, "plots", None):
            check_output_dir("--plots", args.plots)
    except OutputError as exc:
        return str(exc)
    return None


def _emit(text: str, output: str | None) -> str | None:
    """``text`` on stdout, or written whole to ``output``; why it could not be, else None."""
    if output is None:
        print(text)
        return None
    try:
        write_atomic(output, (text + "\n").encode())
    except WriteError as exc:
        return str(exc)
    return None


def run(args: argparse.Namespace) -> int:
    """Body of ``syncbench report``; returns the exit status (2 on a bad file or flag)."""
    def err(message: str) -> None:
        print(f"syncbench report: {message}", file=sys.stderr)

    problem = _output_problem(args) or plot_flags_problem(args)
    if problem:
        err(problem)
        return 2
    if getattr(args, "compare", False):  # two sets of runs A B (analysis.compare)
        return compare_main(args, err)
    try:  # results files and folders stand for their run files (analysis.inputs)
        inputs = expand(args.runs)
    except InputError as exc:
        err(str(exc))
        return 2
    if args.format in TABLES:
        return _tidy(args, err, inputs.paths)
    by = by_keys(getattr(args, "by", None))
    series = by_keys(getattr(args, "series", None))
    plots_dir = getattr(args, "plots", None)
    output = getattr(args, "output", None)
    try:
        if plots_dir:
            require_matplotlib()
        window = parse_steps(args.timeline_steps) if getattr(args, "timeline_steps", None) \
            else None
        runs = load_runs(inputs.paths, warn=err)
        recorded = [line for path, data in inputs.results
                    for line in [*runner_tables(path, data, runs), ""]] \
            if args.format == "md" else []
        check_by_keys(runs, by)
        check_by_keys(runs, series, "--series")
        target = getattr(args, "target_accuracy", None)
        target_loss = getattr(args, "target_loss", None)
        problem = target_problem(target, target_loss) or (
            loss_target_problem(runs) if target_loss is not None else None)
        if problem:
            raise ValueError(problem)
        rows = report_tables(runs, by, target, series, target_loss)
        # runs recorded with --events on: count, bytes and time per collective (md only)
        collectives = format_collectives_md(collective_rows(runs)) if args.format == "md" \
            else ""
    except (RunFileError, ValueError, ImportError) as exc:
        err(str(exc))
        return 2
    contexts = [machine_context(run) for run in runs]  # once per run
    context = format_contexts(contexts)  # context.context_line(runs)
    by_path = {run.path: ctx for run, ctx in zip(runs, contexts, strict=True)}
    for row in rows:  # the JSON and CSV rows carry their own machine line
        paths = row[PATH_KEY] if isinstance(row[PATH_KEY], list) else [row[PATH_KEY]]
        row["machine"] = format_contexts([by_path[p] for p in paths if p in by_path])
    text = "\n".join([*recorded, format_tables(rows, args.format, by,
                                                getattr(args, "per_rank", False), context)])
    # then, in Markdown, where each run's data came from (and its hash)
    data = format_data_md(runs) if args.format == "md" else ""
    text += "".join(f"\n\n{section}" for section in (collectives, data) if section)
    problem = _emit(text, output)
    if problem:
        err(problem)
        return 2
    if plots_dir:
        per_run = rows if not by else table_rows(runs, by, target, series, target_loss)
        return _plots(args, runs, per_run, by, window, err)
    return 0


def _plots(args: argparse.Namespace, runs: Sequence[Run], rows: list[dict[str, Any]],
           by: Sequence[str], window: tuple[int, int | None] | None,
           err: Callable[[str], None]) -> int:
    """``--plots DIR``: the figures, their notes and a closing line; 2 when the folder
    cannot be written after all (it changed since it was checked)."""
    try:
        written, notes = write_plots(runs, rows, args.plots, by=by, window=window,
                                     output=plot_output(args),
                                     per_run=getattr(args, "per_run_plots", False))
    except OSError as exc:
        err(f"--plots {args.plots}: {exc.strerror or exc}")
        return 2
    for note in notes:
        err(f"note: {note}")
    err(f"wrote {len(written)} plots to {args.plots}")
    return 0


def _tidy(args: argparse.Namespace, err: Callable[[str], None],
               paths: Sequence[str]) -> int:
    """``--format steps|eval`` (:mod:`syncbench.analysis.steps`): the tidy table of the
    runs on stdout or in ``-o FILE``; 2 on a bad file or flag."""
    try:
        write_table(load_runs(paths, warn=err), args.format, args.output)
    except (RunFileError, ValueError, OSError) as exc:
        err(str(exc))
        return 2
    return 0
