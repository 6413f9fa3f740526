"""The pairs behind ``syncbench peers`` (its command line and what it compares:
:mod:`syncbench.bench.commands.peers`): each cell's plan of ours against the PyTorch
peer, the runs, their samples and the fixed-column tables, and the one-process speed
table of ``--speed``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from syncbench.analysis.output_paths import OutputError, check_output_dir
from syncbench.analysis.repeats import column_spread
from syncbench.bench.experiment.launch import find_mpiexec, run_command, timed_out
from syncbench.bench.experiment.peers.torch_runner import MODELS, check_compress
from syncbench.bench.experiment.plan import PlannedRun
from syncbench.bench.experiment.runner import execute, launch_planned
from syncbench.bench.experiment.scenario import Condition, RunEntry
from syncbench.kernels import cpu_native
from syncbench.kernels.zoo import parse_gpt_spec

ALGORITHMS = ("ssgd", "localsgd")
HOMOGENEOUS = Condition(None, None)


@dataclass
class Samples:
    """Per-repeat measurements of one (np, model, algorithm) cell."""

    ours: list[float] = field(default_factory=list)
    peer: list[float] = field(default_factory=list)
    peer_name: str = ""
    accuracy: list[float] = field(default_factory=list)
    peer_accuracy: list[float] = field(default_factory=list)


# -- one run of each kind -----------------------------------------------------

def common_flags(args: argparse.Namespace, model: str) -> list[str]:
    """Flags both ours and the peer take, with the same meaning."""
    return ["--model", model, "--dataset", args.dataset, "--epochs", str(args.epochs),
            "--batch-size", str(args.batch_size), "--seed", str(args.seed),
            "--synthetic-samples", str(args.synthetic_samples), "--period", str(args.period)]


def own_train_flags(algorithm: str, train_flags: str) -> list[str]:
    """``--train-flags`` without the options of other strategies: ``'--comm blocking'``
    goes to SSGD's runs and not to Local SGD's, which train would refuse. A flag that is
    no strategy's option goes to every run."""
    from syncbench.algorithms.flags import flag_name
    from syncbench.algorithms.registry import option_owners

    owners, switches = {}, set()
    for option, names in option_owners().values():
        owners[flag_name(option)] = names
        if option.metadata.get("flag"):
            switches.add(flag_name(option))
    tokens, kept, i = shlex.split(train_flags), [], 0
    while i < len(tokens):
        name = tokens[i].split("=", 1)[0]
        if name.startswith("--no-") and "--" + name[5:] in owners:
            name, span = "--" + name[5:], 1
        else:
            span = 2 if name in owners and name not in switches and "=" not in tokens[i] else 1
        if name not in owners or algorithm in owners[name]:
            kept.extend(tokens[i:i + span])
        i += span
    return kept


#: Our SSGD flags the peer takes too, with the same meaning (its DDP communication hook).
SHARED_SSGD_FLAGS = ("--compress", "--powersgd-start")


def peer_ssgd_flags(train_flags: str) -> list[str]:
    """The flags of ``--train-flags`` that the SSGD peer takes too (``--compress fp16``:
    PyTorch's ``fp16_compress_hook``; ``powersgd:R``: its ``powerSGD_hook``)."""
    tokens, kept, i = shlex.split(train_flags), [], 0
    while i < len(tokens):
        name, eq, value = tokens[i].partition("=")
        if name in SHARED_SSGD_FLAGS:
            if not eq and i + 1 < len(tokens):
                value, i = tokens[i + 1], i + 1
            kept += [name, value]
        i += 1
    return kept


def plan_cell(args: argparse.Namespace, np_: int, model: str, algorithm: str,
              tmp: Path) -> list[PlannedRun]:
    """``--repeats`` rounds of ours (``syncbench train``) then the peer (its ``torch``
    program), each writing its run file into ``tmp``."""
    common = common_flags(args, model)
    # train refuses another strategy's flag: --period is ours only where it is an option
    at = common.index("--period")
    own = common if algorithm == "localsgd" else common[:at] + common[at + 2:]
    ours = RunEntry(algorithm, algorithm, (*own, "--eval-every", "0",
                                           *own_train_flags(algorithm, args.train_flags)),
                    algorithm)
    shared = peer_ssgd_flags(args.train_flags) if algorithm == "ssgd" else []
    peer = RunEntry(f"{algorithm}-peer", algorithm, (*common, *shared), algorithm)
    plan = []
    for repeat in range(args.repeats):
        stem = tmp / f"{algorithm}-{model}-np{np_}-r{repeat}"
        path = stem.with_suffix(".h5")
        plan.append(PlannedRun(repeat, ours, HOMOGENEOUS, path, (
            "--algorithm", algorithm, *ours.flags, "--progress", "never", "--out", str(path),
            "--overwrite"), np_))
        path = Path(f"{stem}-peer.json")
        plan.append(PlannedRun(repeat, peer, HOMOGENEOUS, path, (
            "--algorithm", algorithm, *peer.flags, "--out", str(path)), np_, cell=1,
            program="torch"))
    return plan


class PairProgress:
    """The line of each (ours, peer) round; a failed run ends the command."""

    def __init__(self, model: str, repeats: int) -> None:
        self.model, self.repeats = model, repeats
        self.runs: dict[str, Any] = {}

    @staticmethod
    def say(line: str) -> None:
        print(line, flush=True)

    def kept(self, i: int, total: int, p: PlannedRun, run: Any) -> None:
        """A kept run says nothing (``execute`` has put it in :attr:`runs`)."""

    def starting(self, i: int, total: int, p: PlannedRun, why: str) -> bool:
        return True

    def ended(self, i: int, total: int, p: PlannedRun, run: Any,
              proc: subprocess.CompletedProcess, seconds: float, left_s: float,
              stopped_by: str) -> None:
        if proc.returncode != 0:
            raise RuntimeError(self.failed(i, total, p, proc, seconds))
        if p.program == "train":
            return
        ours = self.runs[p.run_id.removesuffix("-peer")].summary["samples_per_s"]
        self.say(f"# np={p.np} {self.model} {p.algorithm} repeat {p.repeat + 1}/"
                 f"{self.repeats}: ours {ours:.0f}, {run['peer']} "
                 f"{float(run['samples_per_s']):.0f} samples/s")

    def failed(self, i: int, total: int, p: PlannedRun, proc: subprocess.CompletedProcess,
               seconds: float) -> str:
        """The one-line failure of ``p``."""
        if timed_out(proc):
            return str(subprocess.TimeoutExpired(proc.args, proc.timeout))
        if p.program == "train":
            tail = " | ".join((proc.stderr or "").strip().splitlines()[-3:])
            return (f"syncbench train --algorithm {p.algorithm} failed "
                    f"(exit {proc.returncode}): {tail}")
        if proc.returncode == 0:
            return "no 'peer-result' line in the peer's output"
        return (f"peer ({p.algorithm}, np={p.np}) failed (exit {proc.returncode}):\n"
                f"{(proc.stderr or '').strip()[-2000:]}")


def samples(plan: list[PlannedRun], runs: dict[str, Any]) -> Samples:
    """The per-repeat figures of one cell's plan (:func:`plan_cell`), from its run files."""
    s = Samples()
    for p in plan:
        run = runs[p.run_id]
        if p.program == "train":
            s.ours.append(float(run.summary["samples_per_s"]))
            s.accuracy.append(float(run.summary["final_accuracy"]))
        else:
            s.peer.append(float(run["samples_per_s"]))
            s.peer_accuracy.append(float(run["accuracy"]))
            s.peer_name = str(run["peer"])
    return s


def measure_cell(args: argparse.Namespace, np_: int, model: str, algorithm: str,
                 tmp: Path) -> Samples:
    """``--repeats`` rounds of ours then the peer, run by the experiment runner's loop
    (with ``--resume``, its resume: complete run files of the plan are kept)."""
    plan = plan_cell(args, np_, model, algorithm, tmp)
    view = PairProgress(model, args.repeats)
    failure = execute(plan, lambda p: launch_planned(p, args.mpiexec, args.run_timeout),
                      bool(getattr(args, "resume", False)), view, runs=view.runs)
    if failure:
        raise RuntimeError(failure)
    return samples(plan, view.runs)


#: The flags that do not change what a run computes (left out of the plan record).
UNPLANNED = ("out_dir", "resume", "mpiexec", "run_timeout", "speed", "steps")
PLAN_NAME = "peers-plan.json"


def plan_record(args: argparse.Namespace) -> dict[str, Any]:
    """What the runs of this invocation are, as ``--resume`` compares it."""
    return {k: v for k, v in sorted(vars(args).items())
            if k not in UNPLANNED and not k.startswith("_") and k != "command"}


def prepare_out_dir(args: argparse.Namespace) -> str | None:
    """Create ``--out-dir`` and record the plan in it; the one-line problem, else None.

    ``--resume`` requires the recorded plan to be this one (the run files of another
    ``--epochs`` or ``--model`` must not be kept), as ``syncbench run --resume`` does."""
    out = Path(args.out_dir)
    record, path = plan_record(args), Path(args.out_dir) / PLAN_NAME
    if args.resume and path.exists():
        try:
            previous = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            return f"--resume: cannot read {path}: {exc}"
        if previous != json.loads(json.dumps(record)):
            return (f"--resume: {path} was written for another plan (flags differ); use "
                    "another --out-dir or drop --resume")
    try:
        out.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(record, indent=1) + "\n")
    except OSError as exc:
        return f"--out-dir {out}: {exc.strerror or exc}"
    return None


def _checked(proc: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    """``proc``, or :class:`subprocess.TimeoutExpired` when it ran past its timeout."""
    if timed_out(proc):
        raise subprocess.TimeoutExpired(proc.args, proc.timeout)
    return proc


def ssgd_comm(args: argparse.Namespace, np_: int, model: str, path: Path) -> dict:
    """``syncbench ssgd-comm`` on ``np_`` ranks for ``model``: its ``--out`` figures."""
    cmd = [*find_mpiexec(args.mpiexec), "-n", str(np_), sys.executable, "-m", "syncbench",
           "ssgd-comm", "--model", model, "--dataset", args.dataset,
           "--synthetic-samples", str(args.synthetic_samples),
           "--batch-size", str(args.batch_size), "--seed", str(args.seed),
           "--blocks", str(args.comm_blocks), "--block-steps", str(args.comm_block_steps),
           "--variants", "mpi,overlap,blocking,tight", "--out", str(path), "--format", "json"]
    proc = _checked(run_command(cmd, args.run_timeout, quiet=True))
    if proc.returncode != 0:
        raise RuntimeError(f"syncbench ssgd-comm (np={np_}) failed (exit {proc.returncode}):\n"
                           f"{proc.stderr.strip()[-2000:]}")
    return json.loads(path.read_text())


# -- the table -------------------------------------------------------------------

def _ratio(a: float, b: float) -> float:
    return a / b if b and b == b else float("nan")


THROUGHPUT_HEADER = (f"# {'np':>3} {'model':<8} {'algorithm':<9} {'peer':<19}"
                     f"{'ours[samples/s]':>16}{'peer[samples/s]':>16}{'ours/peer':>10}"
                     f"{'ours_min':>10}{'ours_max':>10}{'peer_min':>10}{'peer_max':>10}"
                     f"{'acc_ours':>9}{'acc_peer':>9}")
#: What the throughput table is and is not (printed above it).
THROUGHPUT_NOTE = (
    "# throughput-only comparison at equal work (same data, ranks, per-rank batch, steps, "
    "seed and optimizer): samples/s, not time to accuracy; acc_ours / acc_peer are the "
    "final accuracies after that work, a check that both trained, not a convergence ranking")
COMM_HEADER = (f"# {'np':>3} {'model':<8} {'bytes':>9}{'overlap[ms]':>13}{'blocking[ms]':>13}"
               f"{'mpi[ms]':>10}{'tight[ms]':>11}{'overlap/mpi':>12}{'blocking/mpi':>13}"
               f"{'overlap/tight':>14}")


def throughput_row(np_: int, model: str, algorithm: str, s: Samples) -> str:
    """One fixed-column row: medians, the ratio of medians, min/max, accuracies."""
    (ours, ours_min, ours_max), (peer, peer_min, peer_max) = (column_spread(s.ours),
                                                               column_spread(s.peer))
    acc, peer_acc = column_spread(s.accuracy)[0], column_spread(s.peer_accuracy)[0]
    return (f"  {np_:>3} {model:<8} {algorithm:<9} {s.peer_name:<19}"
            f"{ours:>16.1f}{peer:>16.1f}{_ratio(ours, peer):>10.3f}"
            f"{ours_min:>10.0f}{ours_max:>10.0f}{peer_min:>10.0f}{peer_max:>10.0f}"
            f"{acc:>9.4f}{peer_acc:>9.4f}")


def comm_row(np_: int, model: str, figures: dict) -> str:
    """One fixed-column row of SSGD's per-step MPI time against the bare Allreduce."""
    v = figures["variants"]
    return (f"  {np_:>3} {model:<8} {figures['nbytes']:>9}{v['overlap']['last_ms']:>13.4f}"
            f"{v['blocking']['last_ms']:>13.4f}{v['mpi']['last_ms']:>10.4f}"
            f"{v['tight']['last_ms']:>11.4f}{v['overlap']['last_over_mpi']:>12.3f}"
            f"{v['blocking']['last_over_mpi']:>13.3f}{v['overlap']['last_over_tight']:>14.3f}")


SPEED_HEADER = (f"# {'model':<8}{'batch':>6}{'ours[samples/s]':>16}{'torch[samples/s]':>17}"
                f"{'ours/torch':>11}{'ours_min':>10}{'ours_max':>10}{'torch_min':>10}"
                f"{'torch_max':>10}")


#: ``python -c`` bodies measuring one single-process rate: argv = model, batch, steps, seed.
SPEED_CHILD = {
    "ours": "from syncbench.bench.micro.speed import step_throughput as f\n"
            "print(f(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), 1, "
            "seed=int(sys.argv[4]))[0])",
    "torch": "from syncbench.bench.experiment.peers.torch_runner import step_throughput as f\n"
             "print(f(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), seed=int(sys.argv[4])))",
}


def speed_once(args: argparse.Namespace, which: str, model: str) -> float:
    """One single-process rate (samples/s) of ``which`` (ours or torch), in a fresh process."""
    code = "import sys\n" + SPEED_CHILD[which]
    proc = _checked(run_command([sys.executable, "-c", code, model, str(args.batch_size),
                               str(args.steps), str(args.seed)], args.run_timeout, quiet=True))
    if proc.returncode != 0:
        raise RuntimeError(f"{which} speed of {model} failed: {proc.stderr.strip()[-2000:]}")
    return float(proc.stdout.split()[-1])


def speed_table(args: argparse.Namespace, models: list[str]) -> list[str]:
    """``--speed``: alternating single-process step throughput, one row per model."""
    rows = []
    for model in models:
        ours, theirs = [], []
        for _ in range(args.repeats):
            ours.append(speed_once(args, "ours", model))
            theirs.append(speed_once(args, "torch", model))
        (o, o_min, o_max), (t, t_min, t_max) = column_spread(ours), column_spread(theirs)
        rows.append(f"  {model:<8}{args.batch_size:>6}{o:>16.1f}{t:>17.1f}{_ratio(o, t):>11.3f}"
                    f"{o_min:>10.0f}{o_max:>10.0f}{t_min:>10.0f}{t_max:>10.0f}")
    return rows


def _speed_gpt(args: argparse.Namespace, model: str) -> bool:
    """A ``gpt`` spec under ``--speed`` (its PyTorch twin steps; no data-parallel peer)."""
    if not getattr(args, "speed", False):
        return False
    try:
        return parse_gpt_spec(model) is not None
    except ValueError:
        return False


def usage_error(args: argparse.Namespace, algorithms: list[str],
                models: list[str]) -> str | None:
    """What is wrong with the flags (None when nothing is)."""
    if any(a not in ALGORITHMS for a in algorithms) or args.repeats < 1:
        return (f"--algorithms takes {', '.join(ALGORITHMS)} and --repeats >= 1 "
                f"(got {args.algorithms!r}, {args.repeats})")
    if args.comm_blocks < 0 or args.comm_block_steps < 1:
        return (f"--comm-blocks must be >= 0 and --comm-block-steps >= 1 "
                f"(got {args.comm_blocks}, {args.comm_block_steps})")
    if not models or any(m not in MODELS and not _speed_gpt(args, m) for m in models):
        return (f"--model takes {', '.join(MODELS)}, and gpt[:SPEC] with --speed "
                f"(got {args.model!r})")
    if getattr(args, "resume", False) and not getattr(args, "out_dir", None):
        return "--resume needs --out-dir (the folder whose run files it keeps)"
    shared = dict(zip(*[iter(peer_ssgd_flags(args.train_flags))] * 2))
    if "ssgd" in algorithms and shared:
        try:
            start = int(shared.get("--powersgd-start", "1000"))
        except ValueError:
            return f"--powersgd-start takes an integer (got {shared['--powersgd-start']!r})"
        wrong = check_compress(shared.get("--compress", "none"), start)
        if wrong is not None:
            return wrong
    try:
        if getattr(args, "out_dir", None):
            check_output_dir("--out-dir", args.out_dir)
    except OutputError as exc:
        return str(exc)
    return None


def run_speed(args: argparse.Namespace, models: list[str], torch_version: str,
                threads: str) -> int:
    """``--speed``: the one-process step table."""
    print(f"# syncbench peers --speed: one process, batch {args.batch_size}, {args.steps} "
          f"steps x {args.repeats} repeats alternating ours/torch (a fresh process each), "
          f"float32, torch "
          f"{torch_version} with 1 thread, OMP_NUM_THREADS={threads}; our convolutions: "
          f"{cpu_native.status()}", flush=True)
    try:
        rows = speed_table(args, models)
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        print(f"syncbench peers: {exc}", file=sys.stderr)
        return 1
    print("# throughput-only comparison: one process's training step at equal work "
          "(same model, batch, steps); no accuracy")
    print(SPEED_HEADER)
    print("\n".join(rows))
    return 0


def run_pairs(args: argparse.Namespace, models: list[str], algorithms: list[str],
                torch_version: str, threads: str) -> int:
    """The throughput table of ours against the peer (and SSGD's communication table)."""
    print(f"# syncbench peers: {args.dataset}, epochs {args.epochs}, batch {args.batch_size}/rank, "
          f"period {args.period}, seed {args.seed}, {args.repeats} repeats alternating ours/peer; "
          f"torch {torch_version} gloo, OMP_NUM_THREADS={threads}", flush=True)
    if "--sync-bn" in shlex.split(args.train_flags):
        print("# ours with --sync-bn, the peer without: torch's SyncBatchNorm takes GPU "
              "inputs only, the peer normalises with per-rank statistics", flush=True)
    table: list[str] = []
    comm: list[str] = []
    if args.out_dir:
        problem = prepare_out_dir(args)
        if problem:
            print(f"syncbench peers: {problem}", file=sys.stderr)
            return 2
    folder = (contextlib.nullcontext(args.out_dir) if args.out_dir
              else tempfile.TemporaryDirectory(prefix="syncbench-peers-"))
    try:
        with folder as tmp:
            for model in models:
                for np_ in args.np:
                    for algorithm in algorithms:
                        s = measure_cell(args, np_, model, algorithm, Path(tmp))
                        table.append(throughput_row(np_, model, algorithm, s))
                    if "ssgd" in algorithms and np_ >= 2 and args.comm_blocks > 0:
                        figures = ssgd_comm(args, np_, model, Path(tmp) / f"comm-{np_}.json")
                        comm.append(comm_row(np_, model, figures))
    except (RuntimeError, ValueError, subprocess.TimeoutExpired) as exc:
        print(f"syncbench peers: {exc}", file=sys.stderr)
        return 1
    print(THROUGHPUT_NOTE)
    print(THROUGHPUT_HEADER)
    print("\n".join(table))
    if comm:
        print("# SSGD communication efficiency (syncbench ssgd-comm): time inside MPI per step "
              "of the last-arriving rank (comm + wait), medians over rounds; mpi: a bare "
              "Allreduce of the same bytes at the same point of the step (the reference), "
              "tight: back to back without compute; ratios: medians of per-round ratios")
        print(COMM_HEADER)
        print("\n".join(comm))
    return 0
