"""``syncbench run SCENARIO``: one experiment runner for every side-by-side comparison.

A scenario file names the runs (label, algorithm, their own flags, an
optional lr grid), the flags they share, the slowdowns (the homogeneous
configuration is added to every heterogeneous scenario), the ranks, the
repeats, the target accuracy and the headline metric (see
``syncbench.bench.experiment.scenario`` for the format; copy a shipped file
to write your own and pass its path).

The runner launches one ``mpiexec -n NP syncbench train`` per run, one at a
time, in a seeded random order within each repeat (the seed and the order
are recorded), prints one progress line per run, and writes the run files
and one results file, ``results.json`` (scenario, seed, order, machine
context, every run's figures, and per label and configuration the medians
with min–max), into ``--out-dir``. Then it prints, per configuration, the
machine context and a fixed-column table: time to the target accuracy
against the baseline (the headline), samples/s against the baseline, the
sync share, time to target beside the evaluation interval, samples/s and
accuracy, as median (min–max) over repeats; diverged runs show as
"diverged", are left out of the samples/s medians and never count as
faster; overlapped and loaded runs are flagged, and an lr grid's best lr is
said to be chosen on the repeats it is reported on. Heterogeneous
configurations add each strategy's het/hom throughput next to the ceiling
sum(1/f)/N, the realised slowdown factor (per-step medians) and the
interference ratio, flag realised factors that
differ by more than 10%, and label oversubscribed runs.

Timing claims need at least 5 repeats (the shipped timing scenarios default
to 5); ``--repeats 1`` is for a quick look. Flags the runner does not know
go to every ``syncbench train`` and come last, so they override the
scenario's (``--seed``, ``--out``, ``--algorithm``, ``--slowdown``,
``--slowdown-mode`` and ``--target-accuracy`` are the runner's to set:
repeat r trains with ``--seed r``). ``--resume`` keeps the run files a
stopped invocation of the same plan already wrote (complete ones: an
incomplete run file is run again).

A run that is stopped (it exits 128 + SIGTERM, SIGINT or SIGUSR1 and leaves
a run file, or its run file says ``complete=False``) did not consume its
sample budget: its progress line says "STOPPED by SIGTERM", the tables count
it (``2 (1 inc)``) and name it in a note, and no figure or ratio is computed
from it (see ``aggregate``). The runner goes on with the next run; at the end
its last line counts the incomplete runs and it exits 3. When the runner
itself receives SIGINT or SIGTERM it starts no new run, waits for the current
one (which stops itself if it got the signal too, as a Ctrl-C to the
terminal's process group does; the runner does not forward it), prints the
tables of the runs that ended, writes them to the results file (``complete``
false, ``stopped_by``) and exits 128 + the signal; a second signal ends it at
once.
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

from syncbench.bench.cluster.host import ClusterError
from syncbench.bench.cluster.launch import launcher_for_runs
from syncbench.bench.experiment.launch import run_train
from syncbench.bench.train.stopping import stopped_by_status as stop_signal

from .on_cluster import layout_problem, speed_setter
from .plan import PlannedRun, plan_runs
from .scenario import SLOWDOWN_MODES, Scenario, ScenarioError, describe_shipped, load_scenario

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
        if self.signum:
            self._restore()
            signal.raise_signal(signum)
            return
        self.signum = signum
        # os.write: a handler may interrupt a print of the main code
        os.write(2, f"{self.prog}: {self.name}: no new run starts; the current one ends "
                 "first (send it again to end at once)\n".encode())

    @property
    def name(self) -> str:
        """The recorded signal's name ("" when none arrived)."""
        return signal.Signals(self.signum).name if self.signum else ""


def add_runner_arguments(parser: argparse.ArgumentParser) -> None:
    """The runner's own flags (everything else goes to ``syncbench train``)."""
    parser.add_argument("--np", type=int, default=None, help="ranks per run (default: the "
                        "scenario's)")
    parser.add_argument("--repeats", type=int, default=None,
                        help="repeats of every run (default: the scenario's; >= 5 for timing "
                        "claims)")
    parser.add_argument("--out-dir", default=None,
                        help="run files and results.json (default runs/<scenario>)")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed of the run order (default: a fresh one, printed and "
                        "recorded)")
    parser.add_argument("--target-accuracy", type=float, default=None,
                        help="test accuracy whose time is the headline (default: the "
                        "scenario's)")
    parser.add_argument("--slowdown-modes", default=None, metavar="MODE,...",
                        help=f"replace the scenario's slowdown modes ({', '.join(SLOWDOWN_MODES)})")
    parser.add_argument("--mpiexec", default=None,
                        help="launcher (default: $MPIEXEC, else the mpiexec next to this Python)")
    parser.add_argument("--cluster", action="store_true",
                        help="launch every run across the emulated cluster that is up "
                        "(syncbench cluster up; replaces --mpiexec)")
    parser.add_argument("--run-timeout", type=float, default=1800,
                        help="seconds allowed for one run (default 1800)")
    parser.add_argument("--resume", action="store_true",
                        help="keep the run files of a stopped invocation with the same plan")
    parser.add_argument("--dry-run", action="store_true",
                        help="print the plan (one train command per run) and exit")
    parser.add_argument("--plots", default=None, metavar="DIR",
                        help="also write the report's plots of every run to DIR")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench run``; ``--help`` lists the shipped scenarios."""
    parser.add_argument("scenario", metavar="SCENARIO",
                        help="a shipped scenario (below) or the path of a scenario .toml file")
    add_runner_arguments(parser)
    parser.epilog = "shipped scenarios:\n" + describe_shipped()


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
    """Write ``data`` to ``path`` through a temporary file (a file that exists is whole)."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_plain(data), indent=2, allow_nan=False) + "\n")
    tmp.replace(path)


def _scenario_json(scenario: Scenario, np_: int, repeats: int, target: float) -> dict[str, Any]:
    return {
        "name": scenario.name, "source": scenario.source, "description": scenario.description,
        "np": np_, "repeats": repeats, "target_accuracy": target,
        "headline": scenario.headline, "baseline": scenario.baseline,
        "eval_every": scenario.eval_every, "slowdowns": scenario.slowdowns,
        "slowdown_modes": scenario.slowdown_modes, "node_speeds": scenario.node_speeds,
        "cluster": scenario.cluster, "flags": list(scenario.flags),
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


def _readable(path: Path) -> Any:
    """The run file at ``path`` read (a ``Run``), or None when it is not a readable one."""
    from syncbench.analysis.runfile import RunFileError, read_run

    try:
        return read_run(path)
    except RunFileError:
        return None


def _fresh(path: Path, since: float) -> Any:
    """The run file at ``path`` read, when it was written at or after ``since`` (Unix s);
    else None (absent, unreadable, or left by an earlier invocation)."""
    try:
        if path.stat().st_mtime < since:
            return None
    except OSError:
        return None
    return _readable(path)


def _progress(i: int, total: int, p: PlannedRun, run: Any, seconds: float, kept: bool,
              left_s: float | None = None, stopped_by: str = "") -> str:
    """One line per finished run: its figures from the run file's summary (``run``, read)."""
    from syncbench.analysis.summary import run_diverged

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
    return (f"[{i:>{len(str(total))}}/{total}] repeat {p.repeat + 1} {p.entry.label:<16} "
            f"{p.condition.title:<28} {s['samples_per_s']:>9.0f} samples/s  "
            f"accuracy {s['final_accuracy']:.4f}  {state}  ({how})")


def execute(plan: Sequence[PlannedRun], mpiexec: str | None, timeout: float, np_: int,
            resume: bool, say: Callable[[str], None],
            elapsed: dict[str, float] | None = None,
            runs: dict[str, Any] | None = None,
            before: Callable[[PlannedRun], None] | None = None,
            stopped: dict[str, str] | None = None,
            stop: StopRequest | None = None) -> str | None:
    """Run the plan in order; None on success, else a one-line failure.

    ``elapsed`` collects each launched run's seconds (launch to exit) by run id,
    ``runs`` each finished or kept run file, read once, by run id; ``before``
    prepares each run that is launched (the emulated nodes' speeds). A run that
    exits 128 + a stop signal and leaves its run file is no failure: ``stopped``
    gets the signal's name by run id. Once ``stop`` has a signal no new run starts
    (a run that then ends without a run file is no failure either); a kept
    incomplete run file (``resume``) is run again.
    """
    spent: list[float] = []
    for i, p in enumerate(plan, 1):
        if stop is not None and stop.signum:
            break
        kept = _kept(p.path) if resume else None
        if kept is not None:
            if runs is not None:
                runs[p.run_id] = kept
            say(_progress(i, len(plan), p, kept, 0.0, kept=True))
            continue
        if before is not None:
            before(p)
        start = time.perf_counter()
        launched = time.time() - 1.0  # file times may be whole seconds
        try:
            proc = run_train(np_, list(p.args), mpiexec, timeout=timeout, quiet=True)
        except subprocess.TimeoutExpired:
            return f"run {p.run_id} took longer than --run-timeout {timeout:g}s"
        run, name = _ended(p, proc, launched)
        if run is None:
            if stop is not None and stop.signum:
                say(f"# {p.run_id} ended without a run file (exit {proc.returncode}) "
                    f"after {stop.name}")
                break
            tail = " | ".join((proc.stderr or "").strip().splitlines()[-3:])
            return f"run {p.run_id} failed (exit {proc.returncode}): {tail}"
        if name and stopped is not None:
            stopped[p.run_id] = name
        spent.append(time.perf_counter() - start)
        if elapsed is not None:
            elapsed[p.run_id] = spent[-1]
        left = sum(spent) / len(spent) * (len(plan) - i)
        if runs is not None:
            runs[p.run_id] = run
        say(_progress(i, len(plan), p, run, spent[-1], kept=False, left_s=left,
                      stopped_by=name))
    return None


def _kept(path: Path) -> Any:
    """The complete run file at ``path`` read, for ``--resume``; else None (an absent,
    unreadable or incomplete file: that run is run again)."""
    kept = _readable(path) if path.exists() else None
    return kept if kept is not None and kept.complete else None


def _ended(p: PlannedRun, proc: subprocess.CompletedProcess, launched: float
           ) -> tuple[Any, str]:
    """(the run's file read, the stop signal its exit status names): a run that exits 0
    is read (an unreadable file raises), one that exits 128 + a stop signal is read when
    it wrote its file since ``launched``; (None, name) for any other exit."""
    from syncbench.analysis.runfile import read_run

    if proc.returncode == 0:
        return read_run(p.path), ""
    name = stop_signal(proc.returncode)
    return (_fresh(p.path, launched) if name else None), name


def _conditions(plan: Sequence[PlannedRun]) -> list[Any]:
    """The plan's slowdown configurations: homogeneous first, then by factors and mode."""
    seen = list(dict.fromkeys(p.condition for p in plan))
    return sorted(seen, key=lambda c: (not c.homogeneous, str(c.speeds), str(c.factors),
                                      str(c.mode)))


def results(scenario: Scenario, plan: Sequence[PlannedRun], target: float,
            runs: Sequence[Any], stopped: dict[str, str] | None = None
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(per-run records, cells) of the plan's run files, ``runs`` (read, in plan order).

    ``stopped``: run id -> the stop signal its exit status named (see :func:`execute`);
    such a run's record is incomplete whatever its file says.
    """
    from .aggregate import aggregate
    from .measure import run_figures

    records = []
    for p, run, figures in zip(plan, runs, run_figures(runs, target), strict=True):
        name = (stopped or {}).get(p.run_id, "")
        if name:
            figures.update(complete=False, stopped_by=figures["stopped_by"] or name)
        records.append({"run_id": p.run_id, "label": p.entry.label, "group": p.entry.group,
                        "algorithm": p.entry.algorithm, "condition": p.condition.key,
                        "condition_title": p.condition.title, "repeat": p.repeat,
                        "path": str(p.path), **figures,
                        "summary": {**run.summary, **run.summary_extra}})
    labels = [e.label for e in scenario.runs]
    conditions = [c.key for c in _conditions(plan)]
    groups = {e.label: e.group for e in scenario.runs}
    cells = aggregate(records, labels, conditions, scenario.baseline, groups=groups,
                      headline=scenario.headline)
    return records, cells


def format_all(scenario: Scenario, plan: Sequence[PlannedRun], records: list[dict[str, Any]],
               cells: list[dict[str, Any]], target: float,
               world: int | None = None) -> tuple[list[str], list[dict]]:
    """Every table, and the per-configuration comparison facts for the results file
    (``world``: ranks per run, for the parity table's stability bounds)."""
    from syncbench.analysis.fairness import throughput_ceiling

    from .aggregate import factor_spread
    from .tables import comparison_table, hetero_table

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
        from .parity import parity_table

        lines += [""] + parity_table(scenario, records, world or scenario.np)
    return lines, comparisons


def _write_plots(runs: Sequence[Any], out: str, say: Callable[[str], None]) -> None:
    """The report's plots of every run, as ``syncbench report FILES --plots OUT`` writes
    them (the same rows, notes and stderr lines), from the runs already read."""
    from syncbench.analysis.plots import require_matplotlib, write_plots
    from syncbench.analysis.report import partial_warning
    from syncbench.analysis.tables import table_rows

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
    written, notes = write_plots(runs, table_rows(runs), out)
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


def run_scenario(scenario: Scenario, args: argparse.Namespace, extra: Sequence[str],
                 prog: str = "syncbench run") -> int:
    """Plan, run, aggregate and print one scenario; the exit status."""
    np_ = args.np or scenario.np
    repeats = args.repeats or scenario.repeats
    target = args.target_accuracy or scenario.target_accuracy
    problem = _check_settings(scenario, args, np_, repeats, target)
    if problem:
        return _error(prog, problem)
    out_dir = Path(args.out_dir or Path("runs") / scenario.name)
    results_path = out_dir / RESULTS_NAME
    previous = _previous(results_path) if args.resume else None
    seed = args.seed
    if seed is None:
        seed = previous["seed"] if previous and "seed" in previous else secrets.randbelow(2**31)
    try:
        plan = plan_runs(scenario, np_, repeats, seed, out_dir, list(extra), target)
    except ScenarioError as exc:
        return _error(prog, str(exc))
    head = _scenario_json(scenario, np_, repeats, target)
    if args.dry_run:
        for p in plan:
            print(" ".join(shlex.quote(a) for a in ["syncbench", "train", *p.args]))
        return 0
    problem = _resume_problem(args.resume, previous, plan, results_path)
    if problem:
        return _error(prog, problem)
    out_dir.mkdir(parents=True, exist_ok=True)
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
        f"repeat(s), {np_} ranks; order randomised within each repeat, seed {seed}; "
        f"target accuracy {target:g}; run files in {out_dir}/")
    if repeats < MIN_TIMING_REPEATS:
        say(f"# note: {repeats} repeat(s), fewer than {MIN_TIMING_REPEATS}: the timing ratios "
            "are a quick look, not a timing claim")
    elapsed: dict[str, float] = {}
    read: dict[str, Any] = {}
    stopped: dict[str, str] = {}
    with StopRequest(prog) as stop:
        failure = _execute_scenario(scenario, args, plan, np_, say, elapsed, read, stopped,
                                    stop)
    if failure:
        print(f"{prog}: error: {failure} (rerun with --resume to keep the finished runs)",
              file=sys.stderr)
        return 1
    return _tabulate(scenario, args, plan, target, state, out_dir, say, read, elapsed,
                     stopped, stop)


def _tabulate(scenario: Scenario, args: argparse.Namespace, plan: list[PlannedRun],
              target: float, state: dict[str, Any], out_dir: Path, say: Callable[[str], None],
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
    lines, comparisons = format_all(scenario, done, records, cells, target,
                                    getattr(args, "np", None) or scenario.np)
    print("\n".join(lines))
    from syncbench.analysis.context import format_contexts, merge_contexts

    from .aggregate import is_complete

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
        _write_plots(runs, args.plots, say)
    _say_next(scenario, done, out_dir, args.plots, say)
    return _last_line(stop, len(done), len(plan), incomplete, say)


def _last_line(stop: StopRequest, done: int, total: int, incomplete: list[dict[str, Any]],
               say: Callable[[str], None]) -> int:
    """The runner's last line when it was stopped or some runs are incomplete; its exit
    status (128 + the signal, :data:`EXIT_INCOMPLETE`, or 0)."""
    from syncbench.analysis.tables import incomplete_reason

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
                      np_: int, say: Callable[[str], None], elapsed: dict[str, float],
                      read: dict[str, Any], stopped: dict[str, str] | None = None,
                      stop: StopRequest | None = None) -> str | None:
    """:func:`execute`, with each configuration's node speeds set on the emulated cluster
    (a scenario's ``node_speeds``) and the speeds found put back at the end."""
    before, restore = (speed_setter() if scenario.node_speeds and getattr(args, "cluster", False)
                       else (None, None))
    try:
        return execute(plan, args.mpiexec, args.run_timeout, np_, args.resume, say, elapsed,
                       read, before, stopped, stop)
    finally:
        if restore is not None:
            restore()


def _resume_problem(resume: bool, previous: dict | None, plan: list,
                    results_path: Path) -> str | None:
    """Why ``--resume`` cannot continue from ``results_path``, else None."""
    if resume and previous is None:
        return f"--resume: no readable {results_path} (nothing to resume there)"
    if previous and previous.get("plan") != _plan_json(plan):
        return (f"--resume: {results_path} was written for another plan (scenario, flags, "
                "--np, --repeats or --seed differ); use another --out-dir or drop --resume")
    return None


def _check_settings(scenario: Scenario, args: argparse.Namespace, np_: int, repeats: int,
                    target: float) -> str | None:
    """What is wrong with the run's settings, else None; applies ``--slowdown-modes``."""
    if np_ < 1 or repeats < 1 or not 0 < target <= 1:
        return "--np and --repeats must be >= 1 and --target-accuracy in (0, 1]"
    on_cluster = getattr(args, "cluster", False)
    if scenario.node_speeds and not on_cluster:
        return (f"scenario {scenario.name} slows emulated nodes (node_speeds): run it with "
                "--cluster on a cluster that is up (syncbench cluster up)")
    if on_cluster and scenario.cluster and not args.dry_run:
        problem = layout_problem(scenario, np_)
        if problem:
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


def main(args: argparse.Namespace, extra: Sequence[str] | None = None) -> int:
    """Body of ``syncbench run``."""
    try:
        scenario = load_scenario(args.scenario)
        use_cluster(args)
    except (ScenarioError, ClusterError) as exc:
        return _error("syncbench run", str(exc))
    return run_scenario(scenario, args, extra or [])


def alias(name: str, prog: str) -> Callable[..., int]:
    """The body of an old command that is now ``syncbench run NAME`` (``prog`` in its errors)."""

    def body(args: argparse.Namespace, extra: Sequence[str] | None = None) -> int:
        try:
            scenario = load_scenario(name)
            use_cluster(args)
        except (ScenarioError, ClusterError) as exc:
            return _error(prog, str(exc))
        return run_scenario(scenario, args, extra or [], prog)

    return body
