"""The experiment runner behind ``syncbench run``, ``compare`` and ``sweep``: a scenario's
plan launched one ``syncbench train`` at a time, its results file and its tables.

What a user reads of it is ``syncbench run --help``
(:mod:`syncbench.bench.commands.run`); this module holds the runner's flags, shared by
the three commands, and the work: :func:`run_scenario` (a comparison) and
:func:`run_scaling` (a scaling scenario).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from syncbench.analysis.completeness import incomplete_reason
from syncbench.analysis.context import format_contexts, merge_contexts
from syncbench.analysis.fairness import throughput_ceiling
from syncbench.analysis.headline import Headline, headline_from_cells
from syncbench.analysis.output_paths import OutputError, check_output_dir, check_output_file
from syncbench.analysis.plot_style import (
    add_plot_arguments,
    plot_flags_problem,
    plot_output,
    require_matplotlib,
)
from syncbench.analysis.plots import write_plots
from syncbench.analysis.report import partial_warning
from syncbench.analysis.runfile import RunFileError, read_run
from syncbench.analysis.summary import run_diverged
from syncbench.analysis.tables import table_rows
from syncbench.analysis.targets import Target, target_of, target_problem
from syncbench.bench.cluster.launch import launcher_for_runs
from syncbench.bench.experiment.launch import (
    peer_command,
    run_peer,
    run_train,
    signal_running,
    timed_out,
    train_command,
)
from syncbench.bench.files import ExclusiveLock, write_atomic
from syncbench.bench.flags import rank_counts, renamed
from syncbench.bench.train.checkpoint import take_lock
from syncbench.bench.train.stopping import stopped_by_status as stop_signal

from . import sweep as scaling
from .aggregate import factor_spread, is_complete, scenario_cells
from .measure import run_figures
from .on_cluster import layout_problem, speed_setter
from .parity import parity_tables
from .plan import (
    PEER_PROGRAMS,
    PlannedRun,
    check_datasets,
    kept_run,
    plan_runs,
    plan_scaling,
    read_result,
    split_epochs,
)
from .print_tables import comparison_table, hetero_table
from .results_paths import relative_paths, same_plan
from .scenario import SLOWDOWN_MODES, Condition, Scenario, ScenarioError

RESULTS_NAME = "results.json"
RESULTS_SCHEMA = "syncbench-results/1"
#: Repeats below which the runner says that timings are indicative only.
MIN_TIMING_REPEATS = 5
#: The signals that stop the runner after its current run.
RUNNER_STOP_SIGNALS: tuple[signal.Signals, ...] = (signal.SIGINT, signal.SIGTERM)
#: Exit status of a runner whose runs all ended but some of them incomplete.
EXIT_INCOMPLETE = 3


class StopRequest:
    """SIGINT / SIGTERM to the runner: no new run starts, the current one ends first.

    A context manager that installs its handlers in the main thread (elsewhere it
    does nothing). The first signal is recorded (``signum``, ``name``) with one line
    on stderr; a second one restores the previous handlers and raises itself again,
    so the runner ends as it would have without this.
    """

    def __init__(self, prog: str = "syncbench run") -> None:
        self.prog = prog
        self.signum = 0
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in RUNNER_STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def _handle(self, signum: int, frame: object) -> None:
        # The run in flight leads a session of its own (launch.run_command), out of the
        # terminal's reach: it gets a Ctrl-C (the first SIGINT) and any second signal
        # from here, as it did when it shared the runner's process group.
        if self.signum:
            self._restore()
            signal_running(signum)
            signal.raise_signal(signum)
            return
        self.signum = signum
        if signum == signal.SIGINT:
            signal_running(signum)
        # os.write: a handler may interrupt a print of the main code
        os.write(2, f"{self.prog}: {self.name}: no new run starts; the current one ends "
                 "first (send it again to end at once)\n".encode())

    @property
    def name(self) -> str:
        """The recorded signal's name ("" when none arrived)."""
        return signal.Signals(self.signum).name if self.signum else ""


#: ``--run-timeout``'s default, the same for run, compare and sweep: seconds one run may take.
RUN_TIMEOUT_S = 1800.0


def add_run_timeout_argument(parser: argparse.ArgumentParser) -> None:
    """``--run-timeout`` (run, compare, sweep): one default, 0 for no limit."""
    parser.add_argument("--run-timeout", type=_timeout_seconds, default=RUN_TIMEOUT_S,
                        help="seconds allowed for one run, 0 for no limit (default "
                        f"{RUN_TIMEOUT_S:g}; --timeout is train's hang guard, passed through)")


def _timeout_seconds(text: str) -> float | None:
    """``--run-timeout``: seconds >= 0; 0 is no limit (None)."""
    try:
        seconds = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not seconds >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (0: no limit), got {text!r}")
    return seconds or None


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """The runner's own flags (everything else goes to ``syncbench train``).

    Abbreviations are switched off on ``parser``: train's ``--out`` must not be taken
    for ``--out-dir``, nor compare's ``--algorithm`` for ``--algorithms``."""
    parser.allow_abbrev = False
    parser.add_argument("--np", type=rank_counts, default=None, metavar="N,...",
                        help="ranks per run, or several counts (2,4: every run at each, "
                        "in tables of their own) (default: the scenario's)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="repeats of every run (default: the scenario's; >= 5 for timing "
                        "claims)")
    parser.add_argument("--out-dir", default=None,
                        help="run files and results.json (default runs/<scenario>)")
    renamed(parser, ("--seed",), "--order-seed", dest="seed", type=int, default=None,
            help="seed of the run order (default: a fresh one, printed and recorded; "
            "train's --seed, the initialisation, is set by the scenario)")
    parser.add_argument("--target-accuracy", type=float, default=None,
                        help="test accuracy whose time is the headline (default: the "
                        "scenario's)")
    parser.add_argument("--target-loss", type=float, default=None, metavar="NATS",
                        help="a language-model scenario's target instead: validation loss "
                        "(nats per token) whose time is the headline (default: the "
                        "scenario's target_loss)")
    parser.add_argument("--slowdown-modes", default=None, metavar="MODE,...",
                        help=f"replace the scenario's slowdown modes ({', '.join(SLOWDOWN_MODES)})")
    parser.add_argument("--mpiexec", default=None,
                        help="launcher (default: $MPIEXEC, else the mpiexec next to this Python)")
    parser.add_argument("--cluster", action="store_true",
                        help="launch every run across the emulated cluster that is up "
                        "(syncbench cluster up; replaces --mpiexec)")
    add_run_timeout_argument(parser)
    parser.add_argument("--resume", action="store_true",
                        help="keep the run files of a stopped invocation with the same plan")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan, one launch line per run (mpiexec -n N ... "
                        "syncbench train ...), and exit")
    parser.add_argument("--plots", default=None, metavar="DIR",
                        help="also write the figures to DIR: the headline (time to target and "
                        "samples/s of every label against the baseline, per configuration), "
                        "convergence and scaling")
    add_plot_arguments(parser)


def use_cluster(args: argparse.Namespace) -> None:
    """With ``--cluster``, the launcher is the emulated cluster's ``mpiexec``."""
    if getattr(args, "cluster", False):
        args.mpiexec = launcher_for_runs()


def _error(prog: str, message: str) -> int:
    print(f"{prog}: error: {message}", file=sys.stderr)
    return 2


def _plain(value: Any) -> Any:
    """JSON-safe: non-finite floats become null, tuples lists, paths strings."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write the results ``data`` to ``path`` whole or not at all (:func:`write_atomic`),
    its run-file paths relative to ``path``'s folder (:mod:`.results_paths`)."""
    stored = relative_paths(_plain(data), path.parent)
    write_atomic(path, (json.dumps(stored, indent=2, allow_nan=False) + "\n").encode())


def results_lock(results_path: Path) -> ExclusiveLock:
    """The lock an invocation holds on its results file, and so on its ``--out-dir``, from
    before its first write to its end: a second invocation on the same folder fails at
    once, naming the first (a sweep's ``--repeat-index`` tasks have results files of
    their own and share the folder)."""
    what = (f"--out-dir {results_path.parent}" if results_path.name == RESULTS_NAME
            else f"results file {results_path}")
    return ExclusiveLock(results_path.with_name(results_path.name + ".lock"), what)


def _scenario_json(scenario: Scenario, np_: int | list[int], repeats: int,
                   target: Target) -> dict[str, Any]:
    """The scenario as the results file records it (``np``: the count, or the counts of
    ``--np N,...``); what ``syncbench report`` reprints the tables from."""
    scaling = {"scaling": scenario.scaling, "global_batch": scenario.global_batch,
               "batch_size": scenario.batch_size} if scenario.scaling else {}
    return {**scaling,
        "name": scenario.name, "source": scenario.source, "description": scenario.description,
        "np": np_, "repeats": repeats,
        "target_accuracy": target.value if target.metric == "accuracy" else None,
        "target_loss": target.value if target.metric == "loss" else None,
        "headline": scenario.headline, "baseline": scenario.baseline,
        "eval_every": scenario.eval_every, "slowdowns": scenario.slowdowns,
        "slowdown_modes": scenario.slowdown_modes, "node_speeds": scenario.node_speeds,
        "cluster": scenario.cluster, "flags": list(scenario.flags),
        "parity": [dict(pair) for pair in scenario.parity],
        "runs": [{"label": e.label, "algorithm": e.algorithm, "flags": list(e.flags),
                  "group": e.group, "lr": e.lr} for e in scenario.runs],
    }


def _plan_json(plan: Sequence[PlannedRun]) -> list[dict[str, Any]]:
    return [{"run_id": p.run_id, "repeat": p.repeat, "label": p.entry.label,
             "condition": p.condition.key, "path": str(p.path), "args": list(p.args)}
            for p in plan]


def _previous(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _readable(p: PlannedRun) -> Any:
    """The run file of ``p`` read (:func:`read_result`), or None when it is not a
    readable one."""
    try:
        return read_result(p)
    except (RunFileError, ValueError):
        return None


def _fresh(p: PlannedRun, since: float) -> Any:
    """The run file of ``p`` read, when it was written at or after ``since`` (Unix s);
    else None (absent, unreadable, or left by an earlier invocation)."""
    try:
        if p.path.stat().st_mtime < since:
            return None
    except OSError:
        return None
    return _readable(p)


def _progress(i: int, total: int, p: PlannedRun, run: Any, seconds: float, kept: bool,
              left_s: float | None = None, stopped_by: str = "") -> str:
    """One line per finished run: its figures from the run file's summary (``run``, read)."""
    s = run.summary
    ttt = s["time_to_target_s"]
    state = ("DIVERGED" if run_diverged(run) else
             f"to target {ttt:.2f}s" if math.isfinite(ttt) else "target not reached")
    name = run.stopped_by or stopped_by
    if name:
        state = f"STOPPED by {name}, {state}"
    elif not run.complete:
        state = f"INCOMPLETE (partial), {state}"
    how = "kept by --resume" if kept else f"{seconds:.0f}s"
    if left_s is not None and i < total:
        how += f", about {left_s / 60:.0f} min left" if left_s >= 90 else f", {left_s:.0f}s left"
    accuracy = s["final_accuracy"]  # NaN for a language model: its validation loss instead
    quality = (f"accuracy {accuracy:.4f}" if math.isfinite(accuracy)
               else f"val loss {s['final_loss']:.4f}")
    return (f"[{i:>{len(str(total))}}/{total}] repeat {p.repeat + 1} {p.entry.label:<16} "
            f"{p.condition.title:<28} {s['samples_per_s']:>9.0f} samples/s  "
            f"{quality}  {state}  ({how})")


class ComparisonProgress:
    """The runner's line per run (:func:`_progress`); a failed run ends the runner."""

    def __init__(self, say: Callable[[str], None]) -> None:
        self.say = say

    def kept(self, i: int, total: int, p: PlannedRun, run: Any) -> None:
        self.say(_progress(i, total, p, run, 0.0, kept=True))

    def starting(self, i: int, total: int, p: PlannedRun, why: str) -> bool:
        """Whether to launch ``p`` (``why``: why its file is not kept)."""
        return True

    def ended(self, i: int, total: int, p: PlannedRun, run: Any,
              proc: subprocess.CompletedProcess, seconds: float, left_s: float,
              stopped_by: str) -> None:
        self.say(_progress(i, total, p, run, seconds, kept=False, left_s=left_s,
                           stopped_by=stopped_by))

    def failed(self, i: int, total: int, p: PlannedRun, proc: subprocess.CompletedProcess,
               seconds: float) -> str | None:
        """The one-line failure that ends the runner (None: go on with the next run)."""
        if timed_out(proc):
            return f"run {p.run_id} took longer than --run-timeout {proc.timeout:g}s"
        tail = " | ".join((proc.stderr or "").strip().splitlines()[-3:])
        return f"run {p.run_id} failed (exit {proc.returncode}): {tail}"


def execute(plan: Sequence[PlannedRun], launch: Callable[[PlannedRun], Any], resume: bool,
            view: Any, elapsed: dict[str, float] | None = None,
            runs: dict[str, Any] | None = None,
            before: Callable[[PlannedRun], None] | None = None,
            stopped: dict[str, str] | None = None,
            stop: StopRequest | None = None) -> str | None:
    """Run the plan in order; None on success, else the one-line failure ``view`` gave.

    With ``resume`` the complete run files of the plan (:func:`kept_run`) are kept and
    listed first, in the scenario's order; the others are launched (``launch``: one
    ``mpiexec``, a :class:`subprocess.CompletedProcess`) in the plan's order.
    ``view`` prints a line per run (:class:`ComparisonProgress`). ``elapsed``
    collects each launched run's seconds by run id, ``runs`` each finished or kept
    run file, read once, by run id; ``before`` prepares each run that is launched
    (the emulated nodes' speeds). A run that exits 128 + a stop signal and leaves
    its run file is no failure: ``stopped`` gets the signal's name by run id. Once
    ``stop`` has a signal no new run starts (a run that then ends without a run file
    is no failure either).
    """
    runs = {} if runs is None else runs
    why: dict[str, str] = {}
    todo = []
    for p in sorted(plan, key=lambda p: (p.repeat, p.cell)) if resume else []:
        kept, why[p.run_id] = kept_run(p)
        if kept is not None:
            runs[p.run_id] = kept
            view.kept(len(runs), len(plan), p, kept)
    todo = [p for p in plan if p.run_id not in runs]
    spent: list[float] = []
    for i, p in enumerate(todo, len(plan) - len(todo) + 1):
        if stop is not None and stop.signum:
            break
        if not view.starting(i, len(plan), p, why.get(p.run_id, "")):
            continue
        if before is not None:
            before(p)
        start = time.perf_counter()
        launched = time.time() - 1.0  # file times may be whole seconds
        proc = launch(p)
        seconds = time.perf_counter() - start
        run, name = _ended(p, proc, launched)
        if run is None:
            if stop is not None and stop.signum:
                view.say(f"# {p.run_id} ended without a run file (exit {proc.returncode}) "
                         f"after {stop.name}")
                break
            failure = view.failed(i, len(plan), p, proc, seconds)
            if failure:
                return failure
            continue
        if name and stopped is not None:
            stopped[p.run_id] = name
        spent.append(seconds)
        if elapsed is not None:
            elapsed[p.run_id] = seconds
        runs[p.run_id] = run
        view.ended(i, len(plan), p, run, proc, seconds,
                   sum(spent) / len(spent) * (len(plan) - i), name)
    return None


def _ended(p: PlannedRun, proc: subprocess.CompletedProcess, launched: float
           ) -> tuple[Any, str]:
    """(the run's file read, the stop signal its exit status names): a run that exits 0
    is read, one that exits 128 + a stop signal is read when it wrote its file since
    ``launched``; (None, name) for any other exit or an unreadable file."""
    if proc.returncode == 0:
        return _readable(p), ""
    name = stop_signal(proc.returncode)
    return (_fresh(p, launched) if name else None), name


def launch_planned(p: PlannedRun, mpiexec: str | None,
                   timeout: float | None) -> subprocess.CompletedProcess:
    """The launch of one planned run, quietly: ``syncbench train``, or its peer program."""
    if p.program == "train":
        return run_train(p.np, list(p.args), mpiexec, timeout=timeout, quiet=True)
    return run_peer(p.np, PEER_PROGRAMS[p.program], list(p.args), mpiexec, timeout)


def launch_line(p: PlannedRun, mpiexec: str | None) -> list[str]:
    """What :func:`launch_planned` runs for ``p``, launcher included."""
    if p.program == "train":
        return train_command(p.np, list(p.args), mpiexec)
    return peer_command(p.np, PEER_PROGRAMS[p.program], list(p.args), mpiexec)


def print_plan(plan: Sequence[PlannedRun], mpiexec: str | None, seed: int | None = None) -> None:
    """``--dry-run``: one launch line per planned run, in launch order, as it would run,
    after a comment line naming the order's ``seed`` (``--order-seed`` gives this order again).

    Raises :class:`ScenarioError` when no launcher is found."""
    try:
        lines = [shlex.join(launch_line(p, mpiexec)) for p in plan]
    except FileNotFoundError as exc:
        raise ScenarioError(str(exc)) from None
    if seed is not None:
        lines.insert(0, f"# seed {seed}: the order below; --order-seed {seed} runs it in this "
                     "order")
    print("\n".join(lines))


def _conditions(plan: Sequence[PlannedRun]) -> list[Any]:
    """The plan's slowdown configurations: by rank count (``--np 2,4``), then homogeneous
    first, then by factors and mode."""
    seen = list(dict.fromkeys(p.condition for p in plan))
    return sorted(seen, key=lambda c: (c.ranks or 0, not c.homogeneous, str(c.speeds),
                                      str(c.factors), str(c.mode)))


def results(scenario: Scenario, plan: Sequence[PlannedRun], target: Target,
            runs: Sequence[Any], stopped: dict[str, str] | None = None
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(per-run records, cells) of the plan's run files, ``runs`` (read, in plan order).

    ``stopped``: run id -> the stop signal its exit status named (see :func:`execute`);
    such a run's record is incomplete whatever its file says.
    """
    records = []
    for p, run, figures in zip(plan, runs, run_figures(runs, target), strict=True):
        name = (stopped or {}).get(p.run_id, "")
        if name:
            figures.update(complete=False, stopped_by=figures["stopped_by"] or name)
        records.append({"run_id": p.run_id, "label": p.entry.label, "group": p.entry.group,
                        "algorithm": p.entry.algorithm, "np": p.np,
                        "condition": p.condition.key,
                        "condition_title": p.condition.title, "repeat": p.repeat,
                        "path": str(p.path), **figures,
                        "summary": {**run.summary, **run.summary_extra}})
    return records, plan_cells(scenario, plan, records)


def plan_cells(scenario: Scenario, plan: Sequence[PlannedRun],
               records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cells of the plan's run records (:func:`.aggregate.scenario_cells`), each rank
    count of ``--np 2,4`` apart: its configurations, ratios to the baseline's runs and
    het/hom ratios to its own homogeneous runs (``hom-np2``), never another count's."""
    labels = [e.label for e in scenario.runs]
    groups = {e.label: e.group for e in scenario.runs}
    cells = []
    conditions = _conditions(plan)
    for ranks in dict.fromkeys(c.ranks for c in conditions):
        keys = [c.key for c in conditions if c.ranks == ranks]
        cells += scenario_cells([r for r in records if r["condition"] in keys], labels, keys,
                                scenario.baseline, Condition(None, None, None, ranks).key,
                                groups=groups, headline=scenario.headline)
    return cells


def format_all(scenario: Scenario, plan: Sequence[PlannedRun], records: list[dict[str, Any]],
               cells: list[dict[str, Any]], target: Target,
               world: int | None = None) -> tuple[list[str], list[dict]]:
    """Every table, and the per-configuration comparison facts for the results file
    (``world``: ranks per run, for the parity table's stability bounds)."""
    lines: list[str] = []
    comparisons = []
    for cond in _conditions(plan):
        these = [c for c in cells if c["condition"] == cond.key]
        contexts = [r["context"] for r in records if r["condition"] == cond.key]
        lines += [""] + comparison_table(scenario.name, cond.title, these, scenario.baseline,
                                         target, scenario.headline, contexts)
        if cond.homogeneous:
            continue
        ceiling = throughput_ceiling(cond.nominal)
        spread = factor_spread(records, cond.key)
        comparisons.append({"condition": cond.key, "title": cond.title,
                            "factors": list(cond.nominal), "ceiling": ceiling,
                            "realised_factor_spread": spread})
        lines += [""] + hetero_table(scenario.name, cond.title, these, ceiling,
                                     max(cond.nominal), spread, contexts)
    if scenario.parity:
        counts = [c.ranks for c in _conditions(plan) if c.ranks is not None]
        lines += [""] + parity_tables(scenario, records,
                                      list(dict.fromkeys(counts)) or [world or scenario.np])
    return lines, comparisons


def _write_plots(runs: Sequence[Any], args: argparse.Namespace, say: Callable[[str], None],
                 headline: Headline | None = None) -> None:
    """The figures of ``syncbench report FILES --plots DIR`` (the same rows, notes and
    stderr lines, ``--plot-format``, ``--dpi``, ``--per-run-plots``) from the runs already
    read, with the headline of the runner's cells (``headline``) when given."""
    out = args.plots
    def err(message: str) -> None:
        print(f"syncbench report: {message}", file=sys.stderr)

    try:
        require_matplotlib()
    except ImportError as exc:
        err(str(exc))
        say("plots: not written (syncbench report exit 2)")
        return
    for run in runs:
        if not run.complete:
            err(partial_warning(run))
    written, notes = write_plots(runs, table_rows(runs), out, output=plot_output(args),
                                 per_run=getattr(args, "per_run_plots", False),
                                 headline=headline)
    for note in notes:
        err(f"note: {note}")
    err(f"wrote {len(written)} plots to {out}")


def _command_name() -> str:
    """``syncbench`` when that is on PATH as this Python's, else the script's path."""
    script = Path(sys.executable).parent / "syncbench"
    found = shutil.which("syncbench")
    if not script.exists() or (found and Path(found).resolve() == script.resolve()):
        return "syncbench"
    with contextlib.suppress(ValueError):
        return str(script.relative_to(Path.cwd()))
    return str(script)


def run_scaling(scenario: Scenario, args: argparse.Namespace, extra: Sequence[str],
                results_path: Path | None = None, word: str = "results") -> int:
    """Plan, run (keeping every complete run file) and report a scaling scenario
    (:mod:`.sweep`); the exit status. A bad request raises :class:`ScenarioError`
    before anything is written. ``args``: the runner's flags or the sweep's
    (``--repeat-index``, ``--no-run``, ``--simulate``, ``--format``); ``results_path``
    (default OUT_DIR/results.json) gets ``-rK`` before ``.json`` with ``--repeat-index K``;
    ``word`` names it in the closing line."""
    repeats = args.repeats or scenario.repeats
    only = getattr(args, "repeat_index", None)
    if only is not None and not 0 <= only < repeats:
        raise ScenarioError(f"--repeat-index {only} is outside 0..{repeats - 1}")
    out_dir = Path(args.out_dir or Path("runs") / scenario.name)
    own_file = results_path is not None and bool(getattr(args, "manifest", None))
    results_path = results_path or out_dir / RESULTS_NAME
    if only is not None:  # array tasks run side by side
        results_path = results_path.with_name(
            f"{results_path.stem}-r{only}{results_path.suffix}")
    problem = out_dir_problem(out_dir, results_path,
                              results_flag=f"--{word}" if own_file else None)
    if problem:
        raise ScenarioError(problem)
    previous = _previous(results_path)
    seed = planned_seed(getattr(args, "seed", None), previous)
    simulate = getattr(args, "simulate", False)
    plan = plan_scaling(scenario, repeats, seed, out_dir, list(extra), check=not simulate,
                        only_repeat=only)
    if not simulate and not getattr(args, "no_run", False):
        check_datasets(plan)
    if getattr(args, "dry_run", False):
        print_plan(plan, args.mpiexec, seed)
        return 0
    for folder in dict.fromkeys((out_dir, results_path.parent)):
        if problem := make_out_dir(folder):
            raise ScenarioError(problem)
    lock = results_lock(results_path)
    problem = take_lock(lock, "syncbench sweep" if word == "manifest" else "syncbench run")
    if problem:
        raise ScenarioError(problem)
    try:
        return _run_scaling_locked(scenario, args, extra, results_path, word, plan, seed,
                                   repeats, simulate)
    finally:
        lock.release()  # nothing where the file system has no locks


def _run_scaling_locked(scenario: Scenario, args: argparse.Namespace, extra: Sequence[str],
                        results_path: Path, word: str, plan: list[PlannedRun], seed: int,
                        repeats: int, simulate: bool) -> int:
    """:func:`run_scaling` once its results file is locked: run, record, report."""
    state = {"schema": RESULTS_SCHEMA, "complete": False,
             "scenario": _scenario_json(scenario, list(scenario.nps), repeats,
                                        scenario.target),
             "extra_train_args": list(extra), "seed": seed,
             "order": [p.run_id for p in plan], "plan": _plan_json(plan),
             "started_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}

    def save() -> None:
        write_json(results_path, {**state, "runs": scaling.records(view)})

    view = scaling.ScalingProgress(plan, getattr(args, "no_run", False), save)
    save()
    if simulate:
        sim_args = [*scenario.flags, *extra]
        if scenario.scaling == "weak":  # each point's --epochs is the plan's (budget x N)
            sim_args = split_epochs(sim_args)[1]
        launch = scaling.simulated_launch(view, sim_args, args.run_timeout)
    else:
        def launch(p: PlannedRun) -> subprocess.CompletedProcess:
            return launch_planned(p, args.mpiexec, args.run_timeout)
    execute(plan, launch, True, view)
    runs, code = scaling.finish(view, results_path, getattr(args, "format", "md"), word)
    state.update(complete=True, runs=runs,
                 finished_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    write_json(results_path, state)
    if getattr(args, "plots", None):
        _scaling_plots([r["path"] for r in runs if r["status"] in (scaling.RAN, scaling.SKIPPED)],
                       args)
    return code


def _scaling_plots(paths: Sequence[str], args: argparse.Namespace) -> None:
    """``--plots`` of a scaling scenario: the figures of its complete run files."""
    runs = []
    for path in paths:
        try:
            runs.append(read_run(path))
        except RunFileError as exc:
            print(f"syncbench report: {exc}", file=sys.stderr)
    if runs:
        _write_plots(runs, args, print)


def _scaling_scenario(scenario: Scenario, args: argparse.Namespace, extra: Sequence[str],
                      prog: str) -> int:
    """``syncbench run`` of a scaling scenario (:func:`run_scaling`)."""
    if args.np:
        return _error(prog, f"--np: scenario {scenario.name} sets its task counts "
                      f"(np = {list(scenario.nps)})")
    try:
        return run_scaling(scenario, args, extra)
    except ScenarioError as exc:
        return _error(prog, str(exc))


def run_scenario(scenario: Scenario, args: argparse.Namespace, extra: Sequence[str],
                 prog: str = "syncbench run") -> int:
    """Plan, run, aggregate and print one scenario; the exit status."""
    if scenario.scaling:
        return _scaling_scenario(scenario, args, extra, prog)
    nps = list(args.np or [scenario.np])
    repeats = args.repeats or scenario.repeats
    problem = _target_problem(args)
    if problem:
        return _error(prog, problem)
    target = (target_of(args.target_accuracy, getattr(args, "target_loss", None))
              or scenario.target)
    problem = _check_settings(scenario, args, nps, repeats, target)
    if problem:
        return _error(prog, problem)
    out_dir = Path(args.out_dir or Path("runs") / scenario.name)
    results_path = out_dir / RESULTS_NAME
    problem = out_dir_problem(out_dir, results_path)
    if problem:
        return _error(prog, problem)
    previous = _previous(results_path)
    seed = planned_seed(args.seed, previous)
    try:
        plan = plan_runs(scenario, nps, repeats, seed, out_dir, list(extra), target)
        check_datasets(plan)
    except ScenarioError as exc:
        return _error(prog, str(exc))
    head = _scenario_json(scenario, nps[0] if len(nps) == 1 else nps, repeats, target)
    problem = _resume_problem(args.resume, previous, plan, results_path)
    if problem:
        return _error(prog, problem)
    if args.dry_run:
        try:
            print_plan(plan, args.mpiexec, seed)
        except ScenarioError as exc:
            return _error(prog, str(exc))
        return 0
    problem = make_out_dir(out_dir)
    if problem:
        return _error(prog, problem)
    lock = results_lock(results_path)
    problem = take_lock(lock, prog)
    if problem:
        return _error(prog, problem)
    try:
        return _run_locked(scenario, args, extra, prog, plan, out_dir, nps, repeats, target,
                           seed, head)
    finally:
        lock.release()  # nothing where the file system has no locks


def _run_locked(scenario: Scenario, args: argparse.Namespace, extra: Sequence[str], prog: str,
                plan: list[PlannedRun], out_dir: Path, nps: list[int], repeats: int,
                target: Target, seed: int, head: dict[str, Any]) -> int:
    """:func:`run_scenario` once its ``--out-dir`` is locked: run, tabulate, record."""
    results_path = out_dir / RESULTS_NAME
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    state = {"schema": RESULTS_SCHEMA, "complete": False, "scenario": head,
             "extra_train_args": list(extra), "seed": seed,
             "order": [p.run_id for p in plan], "plan": _plan_json(plan),
             "started_utc": started}
    write_json(results_path, state)

    def say(line: str) -> None:
        print(line, flush=True)

    say(f"# syncbench run {scenario.name} ({scenario.source}): {scenario.description}")
    say(f"# {len(plan)} runs: {len(scenario.runs)} labels x "
        f"{len(plan) // max(1, repeats * len(scenario.runs))} configuration(s) x {repeats} "
        f"repeat(s), {','.join(map(str, nps))} ranks; order randomised within each repeat, "
        f"seed {seed}; {target.describe()}; run files in {out_dir}/")
    if repeats < MIN_TIMING_REPEATS:
        say(f"# note: {repeats} repeat(s), fewer than {MIN_TIMING_REPEATS}: the timing ratios "
            "are a quick look, not a timing claim")
    elapsed: dict[str, float] = {}
    read: dict[str, Any] = {}
    stopped: dict[str, str] = {}
    with StopRequest(prog) as stop:
        failure = _execute_scenario(scenario, args, plan, say, elapsed, read, stopped, stop)
    if failure:
        print(f"{prog}: error: {failure} (rerun with --resume to keep the finished runs)",
              file=sys.stderr)
        return 1
    return _tabulate(scenario, args, plan, target, state, out_dir, say, read, elapsed,
                     stopped, stop)


def _tabulate(scenario: Scenario, args: argparse.Namespace, plan: list[PlannedRun],
              target: Target, state: dict[str, Any], out_dir: Path, say: Callable[[str], None],
              read: dict[str, Any], elapsed: dict[str, float], stopped: dict[str, str],
              stop: StopRequest) -> int:
    """The tables and the results file of the runs that ended (``read``), the closing
    lines; the exit status (see :func:`_last_line`)."""
    results_path = out_dir / RESULTS_NAME
    done = [p for p in plan if p.run_id in read]  # every run, unless the runner was stopped
    if not done:
        state.update(stopped_by=stop.name)
        write_json(results_path, state)
        say(f"stopped by {stop.name} before any run ended: nothing to tabulate; rerun with "
            "--resume to run the plan")
        return 128 + stop.signum
    runs = [read[p.run_id] for p in done]
    records, cells = results(scenario, done, target, runs, stopped)
    for record in records:
        record["elapsed_s"] = elapsed.get(record["run_id"])
    nps = list(getattr(args, "np", None) or [scenario.np])
    lines, comparisons = format_all(scenario, done, records, cells, target, nps[0])
    print("\n".join(lines))
    incomplete = [r for r in records if not is_complete(r)]
    contexts = [r["context"] for r in records]
    state.update(complete=not stop.signum, stopped_by=stop.name,
                 incomplete_runs=[r["run_id"] for r in incomplete],
                 finished_utc=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                 machine=merge_contexts(contexts), machine_line=format_contexts(contexts),
                 runs=records, cells=cells, comparisons=comparisons)
    write_json(results_path, state)
    say("")
    say(f"run files: {out_dir}/ ({len(done)} files); results: {results_path}")
    if args.plots:
        titles = {r["condition"]: r["condition_title"] for r in records}
        _write_plots(runs, args, say, headline_from_cells(
            cells, scenario.baseline, titles, scenario.name, target,
            max(p.repeat for p in done) + 1))
    _say_next(scenario, done, out_dir, args.plots, say)
    return _last_line(stop, len(done), len(plan), incomplete, say)


def _last_line(stop: StopRequest, done: int, total: int, incomplete: list[dict[str, Any]],
               say: Callable[[str], None]) -> int:
    """The runner's last line when it was stopped or some runs are incomplete; its exit
    status (128 + the signal, :data:`EXIT_INCOMPLETE`, or 0)."""
    which = ", ".join(f"{r['run_id']} {incomplete_reason(False, r.get('stopped_by'))}"
                      for r in incomplete)
    count = (f"{len(incomplete)} of them incomplete ({which}), "
             "in no figure or ratio" if incomplete else "all complete")
    if stop.signum:
        say(f"stopped by {stop.name}: {done} of {total} runs ended, {count}; "
            f"{total - done} not started; rerun with --resume to run the rest")
        return 128 + stop.signum
    if incomplete:
        say(f"incomplete: {len(incomplete)} of {total} runs did not consume their sample "
            f"budget ({which}): no figure or ratio is computed from them; rerun with "
            "--resume to run them again")
        return EXIT_INCOMPLETE
    return 0


def _execute_scenario(scenario: Scenario, args: argparse.Namespace, plan: list[PlannedRun],
                      say: Callable[[str], None], elapsed: dict[str, float],
                      read: dict[str, Any], stopped: dict[str, str] | None = None,
                      stop: StopRequest | None = None) -> str | None:
    """:func:`execute`, with each configuration's node speeds set on the emulated cluster
    (a scenario's ``node_speeds``) and the speeds found put back at the end."""
    on_nodes = scenario.node_speeds and getattr(args, "cluster", False)
    before, restore = speed_setter(plan) if on_nodes else (None, None)
    def launch(p: PlannedRun) -> subprocess.CompletedProcess:
        return launch_planned(p, args.mpiexec, args.run_timeout)

    try:
        return execute(plan, launch, args.resume, ComparisonProgress(say), elapsed, read,
                       before, stopped, stop)
    finally:
        if restore is not None:
            restore()


def _resume_problem(resume: bool, previous: dict | None, plan: list,
                    results_path: Path) -> str | None:
    """Why the plan cannot be run into ``results_path``'s folder, else None: ``--resume``
    with nothing to resume, or a results file there of another plan (with or without
    ``--resume``: its run files would be overwritten or mixed with this plan's)."""
    if resume and previous is None:
        return f"--resume: no readable {results_path} (nothing to resume there)"
    if previous and not same_plan(previous.get("plan"), _plan_json(plan), results_path.parent):
        if resume:
            return (f"--resume: {results_path} was written for another plan (scenario, "
                    "flags, --np, --repeats or --order-seed differ); use another --out-dir or "
                    "drop --resume")
        return (f"--out-dir {results_path.parent} holds the results of another plan "
                f"({results_path}: scenario, flags, --np, --repeats or --order-seed differ); use "
                f"another --out-dir, or remove {results_path} to replace them")
    return None


def planned_seed(seed: int | None, previous: dict | None) -> int:
    """The seed of the run order: ``--order-seed``, else the one of the results file already in
    the out-dir (so the same command plans the same order, and resumes it), else a fresh
    one (printed by ``--dry-run`` and the run, and recorded)."""
    if seed is not None:
        return seed
    if previous and isinstance(previous.get("seed"), int):
        return previous["seed"]
    return secrets.randbelow(2**31)


def out_dir_problem(out_dir: Path, results_path: Path, flag: str = "--out-dir",
                    results_flag: str | None = None) -> str | None:
    """Why ``out_dir`` (and the results file ``results_path``, named by ``results_flag``
    when it is a flag of its own) cannot be written, else None; checked before planning,
    with ``--dry-run`` too, and nothing is created."""
    try:
        check_output_dir(flag, out_dir)
        check_output_file(results_flag or f"{flag} {out_dir}: results file", results_path,
                          make_parent=True)
    except OutputError as exc:
        return str(exc)
    return None


def make_out_dir(out_dir: Path, flag: str = "--out-dir") -> str | None:
    """Create ``out_dir`` (and its parents); the one-line problem when that fails."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"{flag} {out_dir}: cannot create it: {exc.strerror or exc}"
    return None


def _target_problem(args: argparse.Namespace) -> str | None:
    """What is wrong with ``--target-accuracy`` / ``--target-loss``, else None: a bad
    value or both at once. Either replaces the scenario's target, of either kind (a
    classifier scenario run as a language model with ``--model gpt --dataset
    shakespeare --target-loss X``); the plan checks the kind against every run's
    dataset (``--target-loss`` on a classifier is one line before any launch)."""
    return target_problem(args.target_accuracy, getattr(args, "target_loss", None))


def _check_settings(scenario: Scenario, args: argparse.Namespace, nps: list[int],
                    repeats: int, target: Target) -> str | None:
    """What is wrong with the run's settings (``nps``: the rank counts), else None;
    applies ``--slowdown-modes``."""
    if min(nps) < 1 or repeats < 1:
        return "--np and --repeats must be >= 1"
    if problem := plot_flags_problem(args):
        return problem
    if getattr(args, "plots", None):
        try:
            check_output_dir("--plots", args.plots)
        except OutputError as exc:
            return str(exc)
    on_cluster = getattr(args, "cluster", False)
    if scenario.node_speeds and not on_cluster:
        return (f"scenario {scenario.name} slows emulated nodes (node_speeds): run it with "
                "--cluster on a cluster that is up (syncbench cluster up)")
    if on_cluster and scenario.cluster and not args.dry_run:
        for np_ in nps:
            if problem := layout_problem(scenario, np_):
                return problem
    if args.slowdown_modes:
        modes = [m.strip() for m in args.slowdown_modes.split(",") if m.strip()]
        if not modes or any(m not in SLOWDOWN_MODES for m in modes):
            return f"--slowdown-modes takes {', '.join(SLOWDOWN_MODES)}"
        scenario.slowdown_modes = modes
    return None


def _say_next(scenario: Scenario, plan: list, out_dir: Path, plots: str | None,
              say: Callable[[str], None]) -> None:
    """The next two commands: report the runs, trace the baseline's first run."""
    cmd = _command_name()
    first = min(plan, key=lambda p: (p.entry.label != scenario.baseline,
                                     not p.condition.homogeneous, p.repeat)).path.as_posix()
    say("next:")
    say(f"  {cmd} report {out_dir.as_posix()}/*.h5 --plots {plots or 'plots'}"
        "   # tables and plots of every run")
    say(f"  {cmd} trace {first} -o trace.json   # open in ui.perfetto.dev")
