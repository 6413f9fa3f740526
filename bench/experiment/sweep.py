"""``syncbench sweep``: strong and weak scaling sweeps, one launch per run.

For every repeat r, task count N (``--np 1,2,4``) and algorithm A the sweep
launches ``mpiexec -n N syncbench train --algorithm A ...`` (or any launcher
given by ``--mpiexec``, e.g. ``srun --mpi=pmi2`` inside a Slurm allocation)
and writes the run file ``<out-dir>/<A>-<mode>-np<N>-r<r>.h5``.

* ``--mode strong`` keeps the total work fixed: the global mini-batch B
  (``--global-batch``), each rank taking b = B / N samples per step (an error
  unless N divides B), and the sample budget (``--epochs E``: E passes over
  the training set in all). For SSGD every N then applies the same
  large-batch update, the N-rank mean of per-rank mean gradients
  (docs/ALGORITHMS.md, SSGD: "N ranks with per-rank batch b give the same
  parameters as one process with batch N*b"), so only the time per step
  changes with N.
* ``--mode weak`` keeps the work per rank fixed: the per-rank batch b
  (``--batch-size``) and the budget per rank: ``--epochs E`` is what one rank
  processes, so a run on N ranks gets ``--epochs E*N`` (E*N passes over the
  training set in all) and every rank takes the same number of steps at
  every N (up to the rounding of a shard to whole batches).

Every run is launched with ``--scaling-mode <mode>``, so its run file records
the mode (root attribute ``scaling_mode``), and both this sweep's table and
``syncbench report`` take it from there (``syncbench.analysis.tables``). With
X(N) the samples/s of a run and X0 the median at the smallest N0 of its
series, the table gives the medians over repeats of

* strong: speedup S = X / X0 (= T(N0) / T(N), the same work), efficiency
  E = S * N0 / N;
* weak: efficiency E = (X / N) / (X0 / N0) (throughput per rank, = T(N0) /
  T(N) for the same work per rank), and the scaled speedup S = X / X0.

Runs that overlapped on a host (``analysis.context``: their wall-clock
intervals intersect) are flagged "overlapped" and get no speedup or
efficiency; a point with a single world size shows "-". The machine context
(cores, ranks per core, oversubscription) heads the table. Samples/s are
medians over the runs that did not diverge ("diverged" when none is left).
The report printed before it is ``syncbench report``'s tables.

The manifest ``<out-dir>/manifest.json`` lists every planned run (algorithm,
np, repeat, batch_size, path, status) and is rewritten after each run. The
sweep is resumable: a run whose file exists, reads back complete with
:func:`syncbench.analysis.runfile.read_run` and matches the planned
algorithm, task count and batch is skipped. ``--no-run`` only collects the
existing files into the manifest and the report (the final job of a Slurm
sweep, jobs/slurm/sweep.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from syncbench.analysis.report import FORMATS
from syncbench.analysis.runfile import RunFileError, read_run
from syncbench.bench.cluster.host import ClusterError
from syncbench.bench.cluster.launch import launcher_for_runs

from .scaling_table import _report_text

MODES = ("strong", "weak")
#: Train flags the sweep sets itself for every run.
RESERVED = ("--out", "--algorithm", "--batch-size", "--scaling-mode")
#: ``syncbench train``'s default ``--epochs``.
DEFAULT_EPOCHS = 1.0
MANIFEST_SCHEMA = "syncbench-sweep/1"

# Statuses of a planned run in the manifest.
RAN, SKIPPED, FAILED, MISSING = "ran", "skipped", "failed", "missing"


class SweepError(ValueError):
    """A bad sweep request; the message is one line."""


@dataclass
class PlannedRun:
    """One (algorithm, task count, repeat) of the sweep and what became of it."""

    algorithm: str
    np: int
    repeat: int
    batch_size: int
    path: str
    #: ``--epochs`` of this run (weak mode: the per-rank budget times N); None: train's own.
    epochs: float | None = None
    mode: str = "strong"
    status: str = "pending"
    seconds: float | None = None
    returncode: int | None = None
    note: str = ""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``syncbench sweep``; unknown flags are passed to ``syncbench train``.

    Abbreviations are switched off on ``parser``: ``--out`` or ``--algorithm``
    (train flags) must not be taken for ``--out-dir`` or ``--algorithms``.
    """
    parser.allow_abbrev = False
    parser.add_argument("--mode", choices=MODES, default="strong",
                        help="strong: fixed global batch; weak: fixed per-rank batch "
                        "(default strong)")
    parser.add_argument("--np", default="1,2,4",
                        help="comma-separated task counts (default 1,2,4)")
    parser.add_argument("--algorithms", default="ssgd",
                        help="comma-separated algorithms (default ssgd)")
    parser.add_argument("--out-dir", default="runs/sweep",
                        help="run files, manifest.json and report (default runs/sweep)")
    parser.add_argument("--repeats", type=int, default=1, help="runs per point (default 1)")
    parser.add_argument("--repeat-index", type=int, default=None,
                        help="run only this repeat (0-based; one element of a Slurm job array)")
    parser.add_argument("--global-batch", type=int, default=256,
                        help="strong mode: global batch, split over the N ranks (default 256)")
    parser.add_argument("--batch-size", type=int, default=64,
                        help="weak mode: per-rank batch (default 64)")
    parser.add_argument("--cluster", action="store_true",
                        help="launch every run across the emulated cluster that is up "
                        "(syncbench cluster up; replaces --mpiexec)")
    parser.add_argument("--mpiexec", default=None,
                        help="launcher, e.g. 'srun --mpi=pmi2' (default: $MPIEXEC, else the "
                        "mpiexec next to this Python)")
    parser.add_argument("--run-timeout", type=float, default=None,
                        help="seconds allowed per run (default: no limit; --timeout is "
                        "train's hang guard, passed through)")
    parser.add_argument("--manifest", default=None,
                        help="manifest path (default OUT_DIR/manifest.json; with "
                        "--repeat-index K, -rK is added before .json)")
    parser.add_argument("--no-run", action="store_true",
                        help="launch nothing: collect existing run files into the manifest "
                        "and the report")
    parser.add_argument("--format", default="md", choices=FORMATS,
                        help="report format (default md)")
    parser.add_argument("--simulate", action="store_true",
                        help="simulate every point with syncbench simulate (SimGrid) instead "
                        "of launching it; unknown flags go to simulate (--workload, "
                        "--platform, --stragglers, --steps, ...)")


def parse_counts(text: str) -> list[int]:
    """``"1,2,4"`` -> ``[1, 2, 4]``: positive, distinct task counts in the given order."""
    try:
        counts = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise SweepError(f"--np {text!r}: expected comma-separated integers") from None
    if not counts or any(n < 1 for n in counts):
        raise SweepError(f"--np {text!r}: task counts must be >= 1")
    if len(set(counts)) != len(counts):
        raise SweepError(f"--np {text!r}: task counts repeat")
    return counts


def per_rank_batch(mode: str, np_: int, global_batch: int, batch_size: int) -> int:
    """The per-rank batch of a run on ``np_`` ranks (module docstring)."""
    if mode == "weak":
        if batch_size < 1:
            raise SweepError(f"--batch-size must be >= 1, got {batch_size}")
        return batch_size
    if global_batch < 1:
        raise SweepError(f"--global-batch must be >= 1, got {global_batch}")
    if global_batch % np_:
        raise SweepError(f"--global-batch {global_batch} is not divisible by {np_} ranks "
                         "(strong scaling splits it evenly)")
    return global_batch // np_


def run_name(algorithm: str, mode: str, np_: int, repeat: int) -> str:
    """The run file name of one point: ``<algorithm>-<mode>-np<N>-r<repeat>.h5``."""
    return f"{algorithm}-{mode}-np{np_}-r{repeat}.h5"


def plan(args: argparse.Namespace) -> list[PlannedRun]:
    """Every run of the sweep, repeat-major so that noise spreads over the points."""
    counts = parse_counts(args.np)
    algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
    if not algorithms:
        raise SweepError("--algorithms is empty")
    if args.repeats < 1:
        raise SweepError(f"--repeats must be >= 1, got {args.repeats}")
    repeats = range(args.repeats)
    only = getattr(args, "repeat_index", None)
    if only is not None:
        if not 0 <= only < args.repeats:
            raise SweepError(f"--repeat-index {only} is outside 0..{args.repeats - 1}")
        repeats = range(only, only + 1)
    batches = {n: per_rank_batch(args.mode, n, args.global_batch, args.batch_size)
               for n in counts}
    epochs = getattr(args, "epochs_per_rank", None)
    out_dir = Path(args.out_dir)
    return [PlannedRun(a, n, r, batches[n], str(out_dir / run_name(a, args.mode, n, r)),
                       epochs=run_epochs(args.mode, n, epochs), mode=args.mode)
            for r in repeats for n in counts for a in algorithms]


def run_epochs(mode: str, np_: int, epochs: float | None) -> float | None:
    """``--epochs`` of a run on ``np_`` ranks: weak mode scales the budget with N."""
    if mode != "weak":
        return epochs
    return round((DEFAULT_EPOCHS if epochs is None else epochs) * np_, 12)


def split_epochs(train_args: list[str]) -> tuple[float | None, list[str]]:
    """The ``--epochs`` value among the train flags (None if absent) and the other flags."""
    rest, value, i = [], None, 0
    while i < len(train_args):
        flag = train_args[i]
        if flag == "--epochs" and i + 1 < len(train_args):
            value, i = train_args[i + 1], i + 2
            continue
        if flag.startswith("--epochs="):
            value, i = flag.split("=", 1)[1], i + 1
            continue
        rest.append(flag)
        i += 1
    if value is None:
        return None, rest
    try:
        epochs = float(value)
    except ValueError:
        raise SweepError(f"--epochs {value!r}: expected a number") from None
    if not epochs > 0:
        raise SweepError(f"--epochs must be > 0, got {value}")
    return epochs, rest


def existing_is_complete(run: PlannedRun) -> tuple[bool, str]:
    """Whether ``run.path`` holds a complete run file of exactly this point."""
    if not os.path.exists(run.path):
        return False, ""
    try:
        done = read_run(run.path)
    except RunFileError as exc:
        return False, f"re-running: {exc}"
    if not done.complete:
        return False, "re-running: run file is marked incomplete"
    found = (done.algorithm, done.world_size, done.config.get("batch_size"),
             done.attrs.get("scaling_mode") or None)
    wanted = (run.algorithm, run.np, run.batch_size, run.mode)
    if found != wanted:
        return False, (f"re-running: file has algorithm/np/batch/mode {found}, planned {wanted}")
    if run.epochs is not None and done.config.get("epochs") != run.epochs:
        return False, (f"re-running: file has --epochs {done.config.get('epochs')}, planned "
                       f"{run.epochs:g}")
    return True, ""


def write_manifest(path: Path, args: argparse.Namespace, train_args: list[str],
                   runs: list[PlannedRun]) -> None:
    """Write the manifest atomically (temporary name, then rename)."""
    doc: dict[str, Any] = {
        "schema": MANIFEST_SCHEMA,
        "mode": args.mode,
        "np": parse_counts(args.np),
        "algorithms": list(dict.fromkeys(r.algorithm for r in runs)),
        "repeats": args.repeats,
        "global_batch": args.global_batch if args.mode == "strong" else None,
        "batch_size": args.batch_size if args.mode == "weak" else None,
        "epochs_per_rank": (getattr(args, "epochs_per_rank", None) or DEFAULT_EPOCHS)
        if args.mode == "weak" else None,
        "train_args": train_args,
        "runs": [asdict(r) for r in runs],
    }
    tmp = path.with_name(f".{path.name}.tmp.{os.getpid()}")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    os.replace(tmp, path)


def launch(run: PlannedRun, train_args: list[str], mpiexec: str | None,
           timeout: float | None) -> None:
    """Run one point and record its status, exit code and duration in ``run``."""
    from syncbench.bench.experiment.launch import run_train

    flags = ["--algorithm", run.algorithm, "--batch-size", str(run.batch_size),
             "--scaling-mode", run.mode, "--out", run.path, "--overwrite", *train_args]
    if run.epochs is not None:
        flags += ["--epochs", repr(run.epochs)]
    started = time.perf_counter()
    try:
        proc = run_train(run.np, flags, mpiexec, timeout=timeout, quiet=True)
    except subprocess.TimeoutExpired:
        run.status, run.note = FAILED, f"timed out after {timeout:g} s"
    else:
        run.returncode = proc.returncode
        lines = [ln for ln in (proc.stdout or "").splitlines() if ln.strip()]
        if proc.returncode == 0 and existing_is_complete(run)[0]:
            run.status, run.note = RAN, lines[-1] if lines else ""
        else:
            run.status = FAILED
            err = [ln for ln in (proc.stderr or "").splitlines() if ln.strip()]
            run.note = (err[-1] if err else f"exit status {proc.returncode}")
            sys.stderr.write("".join(f"  | {ln}\n" for ln in err[-20:]))
    run.seconds = round(time.perf_counter() - started, 3)


def report_path(manifest: Path, fmt: str) -> Path:
    """The report beside its manifest: ``manifest-np2.json`` -> ``report-np2.md``."""
    stem = manifest.stem.replace("manifest", "report") if "manifest" in manifest.stem \
        else manifest.stem + "-report"
    return manifest.with_name(f"{stem}.{fmt}")


def check_train_args(train_args: list[str]) -> None:
    """The sweep sets --out, --algorithm and --batch-size itself."""
    for flag in train_args:
        name = flag.split("=", 1)[0]
        if name in RESERVED:
            raise SweepError(f"{name} is set per run by the sweep; use --out-dir, "
                             "--algorithms, --global-batch (strong) or --batch-size (weak)")


def main(args: argparse.Namespace, train_args: list[str] | None = None) -> int:
    """Run (or resume) the sweep, write the manifest and print the report; 0 if all ran."""
    if train_args is None:
        train_args = list(getattr(args, "train_args", None) or [])
    try:
        check_train_args(train_args)
        epochs, rest = split_epochs(train_args)
        if args.mode == "weak":  # the sweep sets --epochs per run (budget per rank x N)
            args.epochs_per_rank, train_args = epochs, rest
        runs = plan(args)
        if args.cluster:
            args.mpiexec = launcher_for_runs()
    except (SweepError, ClusterError) as exc:
        print(f"syncbench sweep: {exc}", file=sys.stderr)
        return 2
    out_dir = Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = Path(args.manifest) if args.manifest else out_dir / "manifest.json"
    if getattr(args, "repeat_index", None) is not None:  # array tasks run side by side
        manifest = manifest.with_name(f"{manifest.stem}-r{args.repeat_index}{manifest.suffix}")
    total = len(runs)
    for i, run in enumerate(runs, 1):
        _run_one(run, f"[{i}/{total}]", args, train_args)
        write_manifest(manifest, args, train_args, runs)
    good = [r for r in runs if r.status in (RAN, SKIPPED)]
    if good:
        text = _report_text(runs, good, args.format)
        print()
        print(text)
        report_path(manifest, args.format).write_text(text + "\n")
    bad = [r for r in runs if r.status in (FAILED, MISSING)]
    print(f"\nsweep: {len(good)} of {total} runs complete "
          f"({sum(r.status == RAN for r in runs)} ran, {sum(r.status == SKIPPED for r in runs)} "
          f"skipped, {len(bad)} failed or missing); manifest {manifest}", flush=True)
    return 1 if bad else 0


def _run_one(run: Any, counter: str, args: argparse.Namespace, train_args: list[str]) -> None:
    """Launch one planned run unless its file is complete (or ``--no-run``); print its status."""
    label = (f"{counter} {run.algorithm} np={run.np} repeat={run.repeat} "
             f"batch/rank={run.batch_size}")
    complete, note = existing_is_complete(run)
    if complete:
        run.status, run.note = SKIPPED, "complete run file exists"
    elif args.no_run:
        run.status, run.note = MISSING, note or "no run file"
    else:
        if note:
            print(f"{label}: {note}", flush=True)
        print(f"{label}: running -> {run.path}", flush=True)
        if getattr(args, "simulate", False):
            from syncbench.bench.simulate.sweep import launch_simulated

            launch_simulated(run, train_args, args.run_timeout, existing_is_complete)
        else:
            launch(run, train_args, args.mpiexec, args.run_timeout)
    detail = f" ({run.seconds:.1f} s)" if run.seconds is not None else ""
    print(f"{label}: {run.status}{detail}{': ' + run.note if run.note else ''}", flush=True)


def build_parser() -> argparse.ArgumentParser:
    """A stand-alone parser (``python -m syncbench.bench.experiment.sweep``)."""
    parser = argparse.ArgumentParser(
        prog="syncbench sweep",
        description="Strong or weak scaling sweep: one launch per (algorithm, np, repeat), "
        "then a report. Flags it does not know are passed to syncbench train.")
    add_arguments(parser)
    return parser


if __name__ == "__main__":
    _args, _extra = build_parser().parse_known_args()
    sys.exit(main(_args, _extra))
