"""Scaling scenarios (an ``np`` list): what became of each point, its line, the report.

``syncbench sweep`` and ``syncbench run`` of a scenario with ``np = [1, 2, 4]``
plan one run per (repeat, task count, run entry) (:func:`plan.plan_scaling`:
strong scaling keeps the global batch and the sample budget, weak scaling
the per-rank batch and the budget per rank) and execute it with the
runner's loop. Every run is launched with ``--scaling-mode``, so its run
file records the mode (root attribute ``scaling_mode``) and both the scaling
table (:mod:`.scaling_table`) and ``syncbench report`` take it from there.

A scaling plan always resumes: a run whose file exists, reads back complete
and matches the planned algorithm, task count, batch and mode is skipped
(:func:`plan.kept_run`); the kept runs are listed first, then the others run
in the seeded order within each repeat. A failed run is recorded and the
next one runs. ``--no-run`` launches nothing and only collects the existing
files (the final job of a Slurm sweep, jobs/slurm/sweep.sh).

The results file (the runner's format: scenario, seed, order, plan) lists
every planned run in the scenario's order with its status (ran, skipped,
failed, missing), seconds, exit status and note, and is rewritten after each
run. The report beside it (``report.md`` for ``manifest.json``) is
``syncbench report``'s tables followed, in Markdown, by the scaling table.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from syncbench.bench.experiment.launch import timed_out
from syncbench.bench.simulate.sweep import launch_simulated

from .plan import PlannedRun, kept_run, mismatch
from .scaling_table import _report_text

# Statuses of a planned run.
RAN, SKIPPED, FAILED, MISSING = "ran", "skipped", "failed", "missing"


@dataclass
class PointOutcome:
    """One planned run of a scaling scenario and what became of it."""

    run_id: str
    label: str
    algorithm: str
    np: int
    repeat: int
    batch_size: int
    path: str
    #: ``--epochs`` of this run (weak mode: the per-rank budget times N); None: the flags'.
    epochs: float | None = None
    mode: str = "strong"
    status: str = "pending"
    seconds: float | None = None
    returncode: int | None = None
    note: str = ""

    @classmethod
    def of(cls, p: PlannedRun) -> PointOutcome:
        return cls(p.run_id, p.entry.label, p.algorithm, p.np, p.repeat, p.batch_size or 0,
                   str(p.path), p.epochs, p.mode or "strong")


class ScalingProgress:
    """The lines of a scaling plan, one per state of a run; ``save`` after each run.

    ``no_run``: launch nothing, a run without a complete file is "missing".
    """

    def __init__(self, plan: Sequence[PlannedRun], no_run: bool,
                 save: Callable[[], None]) -> None:
        self.outcomes = {p.run_id: PointOutcome.of(p) for p in
                         sorted(plan, key=lambda p: (p.repeat, p.cell))}
        self.no_run = no_run
        self.save = save

    @staticmethod
    def say(line: str) -> None:
        print(line, flush=True)

    def _label(self, i: int, total: int, p: PlannedRun) -> str:
        return (f"[{i}/{total}] {p.entry.label} np={p.np} repeat={p.repeat} "
                f"batch/rank={p.batch_size}")

    def _done(self, i: int, total: int, p: PlannedRun) -> None:
        o = self.outcomes[p.run_id]
        detail = f" ({o.seconds:.1f} s)" if o.seconds is not None else ""
        self.say(f"{self._label(i, total, p)}: {o.status}{detail}"
                 f"{': ' + o.note if o.note else ''}")
        self.save()

    def kept(self, i: int, total: int, p: PlannedRun, run: Any) -> None:
        o = self.outcomes[p.run_id]
        o.status, o.note = SKIPPED, "complete run file exists"
        self._done(i, total, p)

    def starting(self, i: int, total: int, p: PlannedRun, why: str) -> bool:
        if self.no_run:
            o = self.outcomes[p.run_id]
            o.status, o.note = MISSING, why or "no run file"
            self._done(i, total, p)
            return False
        if why:
            self.say(f"{self._label(i, total, p)}: {why}")
        self.say(f"{self._label(i, total, p)}: running -> {p.path}")
        return True

    def ended(self, i: int, total: int, p: PlannedRun, run: Any,
              proc: subprocess.CompletedProcess, seconds: float, left_s: float,
              stopped_by: str) -> None:
        o = self.outcomes[p.run_id]
        o.returncode, o.seconds = proc.returncode, round(seconds, 3)
        if proc.returncode == 0 and run.complete and not mismatch(replace(p, epochs=o.epochs),
                                                                  run):
            lines = [ln for ln in (proc.stdout or "").splitlines() if ln.strip()]
            o.status, o.note = RAN, lines[-1] if lines else ""
        else:
            self._failed(o, proc)
        self._done(i, total, p)

    def failed(self, i: int, total: int, p: PlannedRun, proc: subprocess.CompletedProcess,
               seconds: float) -> None:
        """Record the failure; the next run goes on (None)."""
        o = self.outcomes[p.run_id]
        o.seconds = round(seconds, 3)
        if timed_out(proc):
            o.status, o.note = FAILED, f"timed out after {proc.timeout:g} s"
        else:
            o.returncode = proc.returncode
            self._failed(o, proc)
        self._done(i, total, p)

    @staticmethod
    def _failed(o: PointOutcome, proc: subprocess.CompletedProcess) -> None:
        err = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
        o.status = FAILED
        o.note = err[-1] if err else f"exit status {proc.returncode}"
        sys.stderr.write("".join(f"  | {ln}\n" for ln in err[-20:]))


def simulated_launch(view: ScalingProgress, sim_args: list[str],
                     timeout: float | None) -> Callable[[PlannedRun], Any]:
    """``--simulate``: each run is ``syncbench simulate`` (:func:`launch_simulated`)."""

    def launch(p: PlannedRun) -> subprocess.CompletedProcess:
        o = view.outcomes[p.run_id]
        launch_simulated(o, sim_args, timeout,
                         lambda o: kept_run(replace(p, epochs=o.epochs)))
        ok = o.status == RAN
        return subprocess.CompletedProcess(list(p.args), 0 if ok else 1, o.note,
                                           "" if ok else o.note)

    return launch


def report_path(results: Path, fmt: str) -> Path:
    """The report beside its results file: ``manifest-np2.json`` -> ``report-np2.md``."""
    for word in ("manifest", "results"):
        if word in results.stem:
            return results.with_name(f"{results.stem.replace(word, 'report')}.{fmt}")
    return results.with_name(f"{results.stem}-report.{fmt}")


def finish(view: ScalingProgress, results: Path, fmt: str, word: str) -> tuple[list[dict],
                                                                                 int]:
    """Print and write the report of the complete runs and the closing line; (every
    planned run's record, the exit status: 0, or 1 when a run failed or is missing)."""
    runs = list(view.outcomes.values())
    good = [o for o in runs if o.status in (RAN, SKIPPED)]
    if good:
        text = _report_text(runs, good, fmt)
        print()
        print(text)
        report_path(results, fmt).write_text(text + "\n")
    bad = [o for o in runs if o.status in (FAILED, MISSING)]
    print(f"\nsweep: {len(good)} of {len(runs)} runs complete "
          f"({sum(o.status == RAN for o in runs)} ran, "
          f"{sum(o.status == SKIPPED for o in runs)} skipped, {len(bad)} failed or missing); "
          f"{word} {results}", flush=True)
    return records(view), 1 if bad else 0


def records(view: ScalingProgress) -> list[dict[str, Any]]:
    """Every planned run's record for the results file, in the scenario's order."""
    return [asdict(o) for o in view.outcomes.values()]
