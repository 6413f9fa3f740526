"""The runs of a scenario, in a seeded random order within each repeat.

Every (run entry, slowdown configuration) cell (at each rank count of ``--np 2,4``:
the configurations of each count are apart, ``hom-np2`` and ``hom-np4``), and in a
scaling scenario
every (task count, run entry) cell, runs once per repeat. Within
a repeat the cells are shuffled by ``random.Random(seed)`` (one generator,
shuffled once per repeat in turn), so slow drifts of the machine (thermal
state, other jobs) do not always hit the same strategy first or last; the
seed and the resulting order are written to the results file, and the same
seed gives the same order. Repeat ``r`` trains with ``--seed r`` for every
cell, so the cells of one repeat differ only in the strategy and the
slowdown and form the pairs that the per-repeat ratios compare.

A scaling scenario (an ``np`` list) passes its flags as they are and sets
per run only ``--algorithm``, ``--batch-size``, ``--scaling-mode``, ``--out``
and, in weak mode, ``--epochs``, after them (the plan's flags win): strong
scaling keeps the global batch B
(per-rank b = B / N, an error unless N divides B) and the sample budget;
weak scaling keeps b and the budget per rank (``--epochs E`` on N ranks is
``--epochs E*N``). Its run files are ``<label>-<mode>-np<N>-r<repeat>.h5``.

Train's parser takes no abbreviation (``--ou`` is not ``--out``), and a file
a scenario asks every run to write (``save_model = NAME``) is written into the
out-dir, as ``<run id>-NAME`` (:data:`~.scenario.OUT_DIR_FILES`).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from syncbench.analysis.runfile import RunFileError, read_run
from syncbench.analysis.targets import Target
from syncbench.bench.train.options import add_train_arguments

from .scenario import (
    OUT_DIR_FILES,
    Condition,
    RunEntry,
    Scenario,
    ScenarioError,
    resolve_dataset,
)

#: Flags that the runner sets per run and a user may not pass through to train.
FORBIDDEN_EXTRA = ("--out", "--algorithm", "--slowdown", "--slowdown-mode",
                   "--target-accuracy", "--target-loss", "--seed", "--resume")
#: The same for a scaling scenario.
SCALING_RESERVED = ("--out", "--algorithm", "--batch-size", "--scaling-mode")
#: Why the comparison runner refuses a flag of :data:`FORBIDDEN_EXTRA`.
RUNNER_SETS = ("is set by the runner for every run and cannot be passed through (see "
               "syncbench run --help)")
#: Peer programs a planned run may launch instead of ``syncbench train`` (their module).
PEER_PROGRAMS = {"torch": "syncbench.bench.experiment.peers.torch_runner"}
#: ``syncbench train``'s default ``--epochs``.
DEFAULT_EPOCHS = 1.0


@dataclass(frozen=True)
class PlannedRun:
    """One ``mpiexec -n np ... syncbench train`` of the plan."""

    repeat: int
    entry: RunEntry
    condition: Condition
    path: Path
    args: tuple[str, ...]
    np: int
    #: Scaling scenarios: the per-rank batch, ``--scaling-mode`` and (weak) ``--epochs``
    #: the run is planned with (None: the flags decide); a kept run file must match them.
    batch_size: int | None = None
    mode: str | None = None
    epochs: float | None = None
    #: Position of its cell in the scenario's order (before the shuffle).
    cell: int = 0
    #: What is launched: ``train`` (``syncbench train``) or a peer program of
    #: :data:`PEER_PROGRAMS`, whose run file is its result record (JSON).
    program: str = "train"

    @property
    def run_id(self) -> str:
        """Unique name within a scenario, e.g. ``oscars-s1-4-work-r2`` (the file's stem)."""
        return self.path.stem

    @property
    def algorithm(self) -> str:
        return self.entry.algorithm


def run_stem(entry: RunEntry, cond: Condition, repeat: int) -> str:
    """File-name-safe id of one run: label (``@lr=`` as ``-lr``), configuration, repeat."""
    return f"{entry.label.replace('@lr=', '-lr')}-{cond.key}-r{repeat}"


def in_out_dir(flags: tuple[str, ...], path: Path) -> tuple[str, ...]:
    """A scenario's ``flags`` for the run of file ``path``: the file of each flag of
    :data:`~.scenario.OUT_DIR_FILES` (a bare name, checked when the scenario was read)
    becomes ``<out-dir>/<run id>-NAME``, beside the run file."""
    names = {"--" + key.replace("_", "-") for key in OUT_DIR_FILES}
    out = list(flags)
    for i in range(len(out) - 1):
        if out[i] in names:
            out[i + 1] = str(path.with_name(f"{path.stem}-{out[i + 1]}"))
    return tuple(out)


def _train_args(scenario: Scenario, entry: RunEntry, cond: Condition, repeat: int,
                target: Target, extra: list[str], path: Path) -> tuple[str, ...]:
    """The flags of one run; the pass-through ``extra`` come last, so they win."""
    dataset = resolve_dataset(scenario.datasets)
    preferred = ("--dataset", dataset) if dataset else ()
    return ("--algorithm", entry.algorithm, *preferred,
            *in_out_dir((*scenario.flags, *entry.flags), path),
            *cond.train_flags(), target.flag, f"{target:g}",
            "--eval-every", f"{scenario.eval_every:g}", "--seed", str(repeat), *extra,
            "--out", str(path), "--overwrite", "--progress", "never")


class _Raising(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ScenarioError(message)


def train_parser() -> argparse.ArgumentParser:
    """``syncbench train``'s parser (no abbreviations, as train's own), raising
    :class:`ScenarioError` on a bad flag."""
    parser = _Raising(prog="syncbench train", add_help=False, allow_abbrev=False)
    add_train_arguments(parser)
    return parser


def check_train_args(args: tuple[str, ...], where: str,
                     parser: argparse.ArgumentParser | None = None) -> None:
    """Parse ``args`` with ``syncbench train``'s parser (``parser``: one built by
    :func:`train_parser`, reused across calls); one-line error on a bad flag, a flag
    of another strategy or a ``--data-dir`` without the data."""
    from syncbench.bench.train.options import check_launch

    parser = parser or train_parser()
    config, unknown = parser.parse_known_args(list(args))
    if unknown:
        raise ScenarioError(f"{where}: syncbench train does not know {' '.join(unknown)}")
    try:  # another strategy's flag, a --data-dir without the data: before any launch
        check_launch(config)
    except ValueError as exc:
        raise ScenarioError(f"{where}: {exc}") from None


def check_extra(extra: list[str], reserved: tuple[str, ...] = FORBIDDEN_EXTRA,
                why: str = RUNNER_SETS) -> None:
    """Refuse pass-through flags that the plan sets itself (``reserved``): ``NAME why``."""
    for flag in extra:
        name = flag.split("=", 1)[0]
        if name in reserved:
            raise ScenarioError(f"{name} {why}")


def check_datasets(plan: list[PlannedRun]) -> None:
    """The check ``syncbench train`` makes before it loads data, made for the whole plan
    before anything is launched (and by ``--dry-run``): every dataset a planned run
    trains on is found where train looks (``--data-dir``, ``$SYNCBENCH_DATA``, the
    system folder); else :class:`ScenarioError` with the look-up's one line."""
    from syncbench.bench.data.catalog import DatasetError, find_dataset_dir

    runs = [p for p in plan if p.program == "train"]
    if not runs:
        return
    parser = train_parser()
    checked: set[tuple[str, str | None]] = set()
    for p in runs:
        flags, _ = parser.parse_known_args(list(p.args))
        key = (flags.dataset, flags.data_dir)
        if key in checked or flags.dataset == "synthetic":
            continue
        checked.add(key)
        try:
            find_dataset_dir(*key)
        except DatasetError as exc:
            raise ScenarioError(f"run {p.run_id}: {exc}") from None


def per_rank_batch(mode: str, np_: int, global_batch: int, batch_size: int) -> int:
    """The per-rank batch of a scaling run on ``np_`` ranks (module docstring)."""
    if mode == "weak":
        if batch_size < 1:
            raise ScenarioError(f"--batch-size must be >= 1, got {batch_size}")
        return batch_size
    if global_batch < 1:
        raise ScenarioError(f"--global-batch must be >= 1, got {global_batch}")
    if global_batch % np_:
        raise ScenarioError(f"--global-batch {global_batch} is not divisible by {np_} ranks "
                            "(strong scaling splits it evenly)")
    return global_batch // np_


def run_epochs(mode: str, np_: int, epochs: float | None) -> float | None:
    """``--epochs`` of a scaling run on ``np_`` ranks: weak mode scales the budget with N."""
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
        raise ScenarioError(f"--epochs {value!r}: expected a number") from None
    if not epochs > 0:
        raise ScenarioError(f"--epochs must be > 0, got {value}")
    return epochs, rest


def read_result(p: PlannedRun) -> Any:
    """The run file of ``p`` read: a ``Run``, or a peer program's record (a dict);
    :class:`RunFileError` or ``ValueError`` when it cannot be read."""
    if p.program == "train":
        return read_run(p.path)
    try:
        return json.loads(p.path.read_text())
    except OSError as exc:
        raise ValueError(str(exc)) from None


def kept_run(p: PlannedRun) -> tuple[Any, str]:
    """(the run file of ``p`` read, "") when it is complete and of this point
    (:func:`mismatch`); else (None, why it is run again, "" when there is no file)."""
    if not p.path.exists():
        return None, ""
    try:
        run = read_result(p)
    except (RunFileError, ValueError) as exc:
        return None, f"re-running: {exc}"
    if p.program != "train":
        same = (run.get("algorithm"), run.get("world_size")) == (p.algorithm, p.np)
        return (run, "") if same else (None, "re-running: a peer record of another point")
    if not run.complete:
        return None, "re-running: run file is marked incomplete"
    why = mismatch(p, run)
    return (None, why) if why else (run, "")


def mismatch(p: PlannedRun, run: Any) -> str:
    """Why the run file ``run`` (read) is not one of ``p``: its algorithm and ranks, and
    what a scaling plan fixes (batch, mode, ``--epochs``); "" when it is."""
    n = 4 if p.mode else 2
    found = (run.algorithm, run.world_size, run.config.get("batch_size"),
             run.attrs.get("scaling_mode") or None)[:n]
    wanted = (p.algorithm, p.np, p.batch_size, p.mode)[:n]
    if found != wanted:
        what = "algorithm/np/batch/mode" if p.mode else "algorithm/np"
        return f"re-running: file has {what} {found}, planned {wanted}"
    if p.epochs is not None and run.config.get("epochs") != p.epochs:
        return (f"re-running: file has --epochs {run.config.get('epochs')}, planned "
                f"{p.epochs:g}")
    return ""


def scaling_name(label: str, mode: str, np_: int, repeat: int) -> str:
    """The run file name of one scaling point: ``<label>-<mode>-np<N>-r<repeat>.h5``."""
    return f"{label}-{mode}-np{np_}-r{repeat}.h5"


def shuffled(cells: list, repeats: int, seed: int) -> list[tuple[int, Any]]:
    """(repeat, cell) in execution order: one ``random.Random(seed)`` shuffles the
    cells once per repeat in turn."""
    rng = random.Random(seed)
    order = []
    for repeat in range(repeats):
        cells_r = list(cells)
        rng.shuffle(cells_r)
        order += [(repeat, cell) for cell in cells_r]
    return order


def plan_scaling(scenario: Scenario, repeats: int, seed: int, out_dir: Path,
                 extra: list[str], check: bool = True,
                 only_repeat: int | None = None) -> list[PlannedRun]:
    """Every run of a scaling scenario in execution order; ``only_repeat``: that repeat's
    runs alone, in the order a full plan gives them."""
    check_extra(extra, SCALING_RESERVED, "is set per run by the plan of a scaling scenario")
    mode = scenario.scaling
    own, passed = list(scenario.flags), list(extra)  # the scenario's, the pass-through ones
    epochs = None
    if mode == "weak":  # the plan sets --epochs per run (budget per rank x N)
        epochs, own = split_epochs(own)
        passed_epochs, passed = split_epochs(passed)  # the last one wins, as in train
        epochs = epochs if passed_epochs is None else passed_epochs
    batches = {n: per_rank_batch(mode, n, scenario.global_batch, scenario.batch_size)
               for n in scenario.nps}
    cells = [(n, entry) for n in scenario.nps for entry in scenario.runs]
    parser = train_parser() if check else None

    def planned(repeat: int, n: int, entry: RunEntry) -> PlannedRun:
        path = out_dir / scaling_name(entry.label.replace("@lr=", "-lr"), mode, n, repeat)
        run_epochs_ = run_epochs(mode, n, epochs)
        args = ("--algorithm", entry.algorithm,
                *in_out_dir((*entry.flags, *own), path), *passed,
                *(("--epochs", repr(run_epochs_)) if run_epochs_ is not None else ()),
                "--batch-size", str(batches[n]), "--scaling-mode", mode, "--out", str(path),
                "--overwrite")
        return PlannedRun(repeat, entry, Condition(None, None), path, args, n, batches[n],
                          mode, run_epochs_, cells.index((n, entry)))

    if parser is not None:
        for n, entry in cells:
            check_train_args(planned(0, n, entry).args,
                             f"scenario {scenario.name}: run {entry.label!r} (np {n})", parser)
    return [planned(repeat, n, entry) for repeat, (n, entry) in
            shuffled(cells, repeats, seed) if only_repeat in (None, repeat)]


def planned_conditions(scenario: Scenario, counts: Sequence[int]) -> list[Condition]:
    """The slowdown configurations at each rank count of ``counts`` (``--np``), in that
    order; with several counts each is marked with its own (``Condition.ranks``), so
    the run ids, cells and tables of one count stay apart from another's."""
    if len(counts) == 1:
        return scenario.conditions(counts[0])
    return [replace(cond, ranks=n) for n in counts for cond in scenario.conditions(n)]


def plan_runs(scenario: Scenario, np_: int | Sequence[int], repeats: int, seed: int,
              out_dir: Path, extra: list[str], target: float | Target,
              check: bool = True) -> list[PlannedRun]:
    """Every run of the scenario in execution order (see the module docstring); ``np_``:
    the rank count, or the counts of ``--np N,...`` (every cell at each); a float
    ``target`` is an accuracy."""
    if not isinstance(target, Target):
        target = Target("accuracy", float(target))
    if scenario.scaling:
        return plan_scaling(scenario, repeats, seed, out_dir, extra, check)
    check_extra(extra)
    counts = [np_] if isinstance(np_, int) else list(np_)
    conditions = planned_conditions(scenario, counts)
    cells = [(entry, cond) for cond in conditions for entry in scenario.runs]
    if check:
        parser = train_parser()  # built once: parsing does not change it
        for entry, cond in cells:
            args = _train_args(scenario, entry, cond, 0, target, extra, out_dir / "x.h5")
            check_train_args(args, f"scenario {scenario.name}: run {entry.label!r} "
                             f"({cond.title})", parser)
    plan = []
    for repeat, (entry, cond) in shuffled(cells, repeats, seed):
        path = out_dir / f"{run_stem(entry, cond, repeat)}.h5"
        args = _train_args(scenario, entry, cond, repeat, target, extra, path)
        plan.append(PlannedRun(repeat, entry, cond, path, args, cond.ranks or counts[0],
                               cell=cells.index((entry, cond))))
    return plan
