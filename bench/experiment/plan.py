"""The runs of a scenario, in a seeded random order within each repeat.

Every (run entry, slowdown configuration) cell runs once per repeat. Within
a repeat the cells are shuffled by ``random.Random(seed)`` (one generator,
shuffled once per repeat in turn), so slow drifts of the machine (thermal
state, other jobs) do not always hit the same strategy first or last; the
seed and the resulting order are written to the results file, and the same
seed gives the same order. Repeat ``r`` trains with ``--seed r`` for every
cell, so the cells of one repeat differ only in the strategy and the
slowdown and form the pairs that the per-repeat ratios compare.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

from .scenario import Condition, RunEntry, Scenario, ScenarioError, resolve_dataset

#: Flags that the runner sets per run and a user may not pass through to train.
FORBIDDEN_EXTRA = ("--out", "--algorithm", "--slowdown", "--slowdown-mode",
                   "--target-accuracy", "--seed", "--resume")


@dataclass(frozen=True)
class PlannedRun:
    """One ``mpiexec ... syncbench train`` of the plan."""

    repeat: int
    entry: RunEntry
    condition: Condition
    path: Path
    args: tuple[str, ...]

    @property
    def run_id(self) -> str:
        """Unique name within a scenario, e.g. ``oscars-s1-4-work-r2``."""
        return run_stem(self.entry, self.condition, self.repeat)


def run_stem(entry: RunEntry, cond: Condition, repeat: int) -> str:
    """File-name-safe id of one run: label (``@lr=`` as ``-lr``), configuration, repeat."""
    return f"{entry.label.replace('@lr=', '-lr')}-{cond.key}-r{repeat}"


def _train_args(scenario: Scenario, entry: RunEntry, cond: Condition, repeat: int,
                target: float, extra: list[str], path: Path) -> tuple[str, ...]:
    """The flags of one run; the pass-through ``extra`` come last, so they win."""
    dataset = resolve_dataset(scenario.datasets)
    preferred = ("--dataset", dataset) if dataset else ()
    return ("--algorithm", entry.algorithm, *preferred, *scenario.flags, *entry.flags,
            *cond.train_flags(), "--target-accuracy", f"{target:g}",
            "--eval-every", f"{scenario.eval_every:g}", "--seed", str(repeat), *extra,
            "--out", str(path), "--overwrite", "--progress", "never")


class _Raising(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise ScenarioError(message)


def train_parser() -> argparse.ArgumentParser:
    """``syncbench train``'s parser, raising :class:`ScenarioError` on a bad flag."""
    from syncbench.bench.train.options import add_train_arguments

    parser = _Raising(prog="syncbench train", add_help=False)
    add_train_arguments(parser)
    return parser


def check_train_args(args: tuple[str, ...], where: str,
                     parser: argparse.ArgumentParser | None = None) -> None:
    """Parse ``args`` with ``syncbench train``'s parser (``parser``: one built by
    :func:`train_parser`, reused across calls); one-line error on a bad flag."""
    parser = parser or train_parser()
    _, unknown = parser.parse_known_args(list(args))
    if unknown:
        raise ScenarioError(f"{where}: syncbench train does not know {' '.join(unknown)}")


def check_extra(extra: list[str]) -> None:
    """Refuse pass-through flags that the runner sets itself."""
    for flag in extra:
        name = flag.split("=", 1)[0]
        if name in FORBIDDEN_EXTRA:
            raise ScenarioError(f"{name} is set by the runner for every run and cannot be "
                                f"passed through (see syncbench run --help)")


def plan_runs(scenario: Scenario, np_: int, repeats: int, seed: int, out_dir: Path,
              extra: list[str], target: float, check: bool = True) -> list[PlannedRun]:
    """Every run of the scenario in execution order (see the module docstring)."""
    check_extra(extra)
    conditions = scenario.conditions(np_)
    cells = [(entry, cond) for cond in conditions for entry in scenario.runs]
    if check:
        parser = train_parser()  # built once: parsing does not change it
        for entry, cond in cells:
            args = _train_args(scenario, entry, cond, 0, target, extra, out_dir / "x.h5")
            check_train_args(args, f"run {entry.label!r} ({cond.title})", parser)
    rng = random.Random(seed)
    plan = []
    for repeat in range(repeats):
        order = list(cells)
        rng.shuffle(order)
        for entry, cond in order:
            path = out_dir / f"{run_stem(entry, cond, repeat)}.h5"
            args = _train_args(scenario, entry, cond, repeat, target, extra, path)
            plan.append(PlannedRun(repeat, entry, cond, path, args))
    return plan
