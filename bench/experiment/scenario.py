"""Scenario files: what a comparison runs, as data.

A scenario is a TOML file (read with :mod:`tomllib`, or the ``tomli``
backport on Python 3.10). The shipped ones live in ``bench/experiment/scenarios/``
(package data ``syncbench.bench.experiment/scenarios/*.toml``); ``syncbench run PATH``
takes any other file. Only ``np`` and at least one ``[[run]]`` are required;
:class:`Scenario` lists every key with an example.

A flag table maps ``name = value`` to ``--name value`` (underscores become
hyphens; ``true`` is a bare switch, ``false`` leaves it out, a list is
comma-joined); a name is the flag's whole name (train takes no
abbreviation), and a file every run writes is a bare name, written into the
out-dir (:data:`OUT_DIR_FILES`). A heterogeneous scenario always gets the homogeneous
configuration (every factor 1) added: the baseline of the het/hom throughput
and of the ceiling sum(1/f)/N. ``"last:F"`` slows the last rank by F at any
rank count; an explicit list must have ``np`` factors. An ``np`` list makes a
scaling scenario (``scaling`` strong or weak, and its batch rule:
:mod:`.plan`), which takes no slowdowns. Every problem is a
:class:`ScenarioError` whose message is one line.
"""

from __future__ import annotations

import argparse
import functools
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from syncbench.algorithms.registry import ALGORITHMS
from syncbench.analysis.targets import Target
from syncbench.bench.cluster.network import RATE
from syncbench.bench.data.catalog import DATASETS, DatasetError, find_dataset_dir
from syncbench.bench.flags import MAX_RANKS
from syncbench.bench.train.slowdown import parse_factor

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the tomli backport (a dependency there)
    import tomli as tomllib

#: Headline metrics a scenario may name.
HEADLINES = ("time_to_target", "samples_per_s")
#: ``--slowdown-mode`` values of ``syncbench train``.
SLOWDOWN_MODES = ("auto", "work", "spin", "sleep")
#: Train flags the runner sets itself, and the scenario key that sets each instead.
RESERVED_FLAGS = {
    "algorithm": "the run entry's 'algorithm'",
    "out": "the runner's --out-dir",
    "overwrite": "nothing (the runner overwrites its own files)",
    "progress": "nothing (the runner prints one line per run)",
    "slowdown": "'slowdowns'",
    "slowdown_mode": "'slowdown_modes'",
    "target_accuracy": "'target_accuracy'",
    "target_loss": "'target_loss'",
    "eval_every": "'eval_every'",
    "seed": "nothing (repeat r trains with seed r)",
}
#: Train flags naming a file that every run writes (besides ``out``, the runner's): a
#: scenario gives a bare file name, which each run writes into the runner's --out-dir as
#: ``<run id>-NAME`` (plan.in_out_dir); a path, absolute or into a folder, is refused.
OUT_DIR_FILES = {"save_model": "the final model (.npy)"}
_TOP_KEYS = {"description", "np", "repeats", "target_accuracy", "target_loss", "headline",
             "baseline",
             "eval_every", "slowdowns", "slowdown_modes", "node_speeds", "cluster", "lr_grid",
             "datasets", "flags", "run", "parity", "scaling", "global_batch", "batch_size"}
#: Scaling modes of a scenario with an ``np`` list.
SCALING_MODES = ("strong", "weak")
#: Train flags a scaling scenario sets per run, and the key that sets each instead.
SCALING_FLAGS = {"batch_size": "'global_batch' (strong) or 'batch_size' (weak)",
                 "scaling_mode": "'scaling'"}
#: Keys of a ``[[parity]]`` table.
_PARITY_KEYS = {"name", "ssgd", "odsgd"}
#: Keys of a scenario's ``cluster`` table.
_CLUSTER_KEYS = {"link", "ppn"}
_RUN_KEYS = {"label", "algorithm", "flags", "lr_grid"}
#: Where the shipped scenarios live, inside the ``syncbench.bench`` package.
SCENARIO_PACKAGE, SCENARIO_DIR = "syncbench.bench.experiment", "scenarios"


class ScenarioError(ValueError):
    """A scenario that cannot be read or is not valid; the message is one line."""


@dataclass(frozen=True)
class RunEntry:
    """One row of the tables: a label, its algorithm and its own train flags."""

    label: str
    algorithm: str
    flags: tuple[str, ...]
    #: Label of the entry this one was expanded from by an lr grid (else its own label).
    group: str
    lr: float | None = None


@dataclass(frozen=True)
class Condition:
    """One slowdown configuration; ``factors`` and ``speeds`` None is the homogeneous one.

    ``factors`` slow ranks by ``--slowdown`` (``mode``: ``--slowdown-mode``);
    ``speeds`` slow the emulated cluster's nodes by a CPU quota (a scenario's
    ``node_speeds``, set by the runner before each run of the configuration).
    """

    factors: tuple[float, ...] | None
    mode: str | None
    speeds: tuple[float, ...] | None = None
    #: The rank count, where a plan has several (``--np 2,4``): part of the key and the
    #: title, so the runs, cells and tables of each count stay apart; None with one count
    #: (the names of a single count's runs are as before).
    ranks: int | None = None

    @property
    def homogeneous(self) -> bool:
        return self.factors is None and self.speeds is None

    @property
    def nominal(self) -> tuple[float, ...]:
        """Each rank's nominal slowdown factor: ``--slowdown``'s, or 1 / its node's speed."""
        if self.speeds is not None:
            return tuple(1.0 / s for s in self.speeds)
        return self.factors or ()

    @property
    def key(self) -> str:
        """File-name-safe id, e.g. ``hom``, ``s1-4-work`` or ``q1-0.25`` (node speeds);
        ``-npN`` added where the plan has several rank counts (``hom-np4``)."""
        return self._key() + (f"-np{self.ranks}" if self.ranks is not None else "")

    def _key(self) -> str:
        if self.speeds is not None:
            return "q" + "-".join(f"{f:g}" for f in self.speeds)
        if self.factors is None:
            return "hom"
        spec = "-".join(f"{f:g}" for f in self.factors)
        return f"s{spec}" + (f"-{self.mode}" if self.mode else "")

    @property
    def title(self) -> str:
        """Human name, e.g. ``homogeneous``, ``slowdown 1,4 mode work`` or
        ``node speed 1,0.25 (CPU quota)``; ``, N ranks`` added where the plan has several
        rank counts."""
        if self.ranks is None:
            return self._title()
        return f"{self._title()}, {self.ranks} rank{'s' if self.ranks != 1 else ''}"

    def _title(self) -> str:
        if self.speeds is not None:
            return "node speed " + ",".join(f"{f:g}" for f in self.speeds) + " (CPU quota)"
        if self.factors is None:
            return "homogeneous"
        spec = ",".join(f"{f:g}" for f in self.factors)
        return f"slowdown {spec}" + (f" mode {self.mode}" if self.mode else "")

    def train_flags(self) -> list[str]:
        """The ``--slowdown`` / ``--slowdown-mode`` flags of this configuration."""
        if self.factors is None:
            return []
        flags = ["--slowdown", ",".join(f"{f:g}" for f in self.factors)]
        return flags + (["--slowdown-mode", self.mode] if self.mode else [])


@dataclass
class Scenario:
    """A checked scenario.

    The keys of its file::

        description = "one line shown above the tables"
        np = 2                         # ranks per run (--np overrides)
        repeats = 5                    # repeats of every run (--repeats overrides)
        target_accuracy = 0.80         # test accuracy whose wall time is the headline
        # target_loss = 1.9            # or, for a language model: validation loss (nats
                                       # per token) whose wall time is the headline
        headline = "time_to_target"    # or "samples_per_s": the first ratio column
        baseline = "ssgd"              # label the ratios are taken against (default: first run)
        eval_every = 0.05              # epochs between evaluations (finer = sharper time to target)
        slowdowns = ["last:4"]         # heterogeneous configurations: "1,4" or "last:4"
        slowdown_modes = ["work"]      # --slowdown-mode of each; omitted: train's default
        node_speeds = ["last:0.25"]    # emulated cluster only: node speeds (CPU quotas), each a
                                       # configuration the runner sets live before its runs
        cluster = { link = "1gbit", ppn = 1 }   # the emulated cluster it is written for:
                                       # `run --cluster` checks the one that is up
        lr_grid = [0.01, 0.02]         # default grid of every run entry (optional)
        datasets = ["mnist", "fashion-mnist"]   # the first whose files are found is --dataset
        flags = { model = "mlp", epochs = 1 }   # shared syncbench-train flags
        # A scaling scenario: an np list, a mode, the batch rule (plan.py); no slowdowns
        # np = [1, 2, 4]; scaling = "strong"; global_batch = 256 (weak: batch_size = 64)

        [[parity]]                     # a table of OD-SGD against SSGD, one row per pair:
        name = "paper recipe"          # does the paper's parity claim hold? (parity.py)
        ssgd = "paper-ssgd"            # the two run labels
        odsgd = "paper-odsgd"

        [[run]]
        label = "odsgd"                # row name, unique
        algorithm = "odsgd"
        flags = { warmup_steps = 50 }  # this entry's flags
        lr_grid = [0.01, 0.02, 0.05]   # one row per lr; the best by the headline is marked
    """

    name: str
    source: str
    description: str
    np: int
    runs: list[RunEntry]
    repeats: int = 5
    target_accuracy: float = 0.80
    headline: str = "time_to_target"
    #: A language model's target instead (nats per token; None: the accuracy's).
    target_loss: float | None = None
    baseline: str = ""
    eval_every: float = 0.05
    slowdowns: list[str] = field(default_factory=list)
    slowdown_modes: list[str] = field(default_factory=list)
    #: Node speeds of the emulated cluster, one configuration each ("last:0.25", "1,0.25").
    node_speeds: list[str] = field(default_factory=list)
    #: The emulated cluster the scenario is written for (``link``, ``ppn``), checked
    #: by ``syncbench run --cluster``; empty: any.
    cluster: dict[str, Any] = field(default_factory=dict)
    flags: tuple[str, ...] = ()
    #: Datasets in order of preference: the first whose files are found is trained on.
    datasets: list[str] = field(default_factory=list)
    #: ``[[parity]]`` pairs: ``{"name", "ssgd", "odsgd"}`` (run labels).
    parity: list[dict[str, str]] = field(default_factory=list)
    #: The parsed TOML, for the results file.
    raw: dict[str, Any] = field(default_factory=dict)
    #: A scaling scenario's task counts (``np = [1, 2, 4]``); empty: one count, ``np``.
    nps: tuple[int, ...] = ()
    #: ``strong`` or ``weak`` for a scaling scenario, else "".
    scaling: str = ""
    #: Strong scaling's global batch, weak scaling's per-rank batch.
    global_batch: int = 256
    batch_size: int = 64

    @property
    def target(self) -> Target:
        """The target whose time is the headline: ``target_loss`` when given, else
        ``target_accuracy``."""
        if self.target_loss is not None:
            return Target("loss", self.target_loss)
        return Target("accuracy", self.target_accuracy)

    @property
    def heterogeneous(self) -> bool:
        return bool(self.slowdowns or self.node_speeds)

    def conditions(self, np_: int) -> list[Condition]:
        """Homogeneous first (added for every heterogeneous scenario), then each slowdown x mode."""
        out = [Condition(None, None)]
        for spec in self.slowdowns:
            factors = resolve_slowdown(spec, np_)
            if all(f == 1.0 for f in factors):
                continue
            for mode in self.slowdown_modes or [None]:
                cond = Condition(factors, mode)
                if cond not in out:
                    out.append(cond)
        for spec in self.node_speeds:
            speeds = resolve_speeds(spec, np_, self.ranks_per_node())
            cond = Condition(None, None, speeds)
            if any(s != 1.0 for s in speeds) and cond not in out:
                out.append(cond)
        return out

    def ranks_per_node(self) -> int:
        """Ranks per emulated node (the ``cluster`` table's ``ppn``, default 1)."""
        return int(self.cluster.get("ppn", 1))


def shipped_scenarios() -> dict[str, Path]:
    """Name -> path of every scenario shipped with the package."""
    folder = resources.files(SCENARIO_PACKAGE) / SCENARIO_DIR
    out = {}
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if item.name.endswith(".toml"):
            out[item.name[:-5]] = Path(str(item))
    return out


def describe_shipped() -> str:
    """One line per shipped scenario: name and description (for ``--help``)."""
    lines = []
    shipped = shipped_scenarios()
    width = max((len(name) for name in shipped), default=0)
    for name, path in shipped.items():
        try:
            desc = load_scenario(str(path)).description
        except ScenarioError as exc:  # pragma: no cover - a broken shipped file
            desc = f"(unreadable: {exc})"
        lines.append(f"  {name:<{width}}  {desc}")
    return "\n".join(lines)


def resolve_slowdown(spec: str, np_: int) -> tuple[float, ...]:
    """Factors of ``"1,4"`` (exactly ``np_`` of them) or ``"last:4"`` (any ``np_``)."""
    text = str(spec).strip()
    if text.startswith("last:"):
        factors = [1.0] * (np_ - 1) + [_factor(text[5:], spec)]
    else:
        factors = [_factor(p, spec) for p in text.split(",")]
        if len(factors) != np_:
            raise ScenarioError(
                f"slowdown {spec!r} has {len(factors)} factors but runs have {np_} ranks "
                f"(write 'last:F' to slow the last rank at any rank count)")
    return tuple(factors)


def resolve_speeds(spec: str, np_: int, ppn: int = 1) -> tuple[float, ...]:
    """Node speeds of ``"1,0.25"`` (one per node) or ``"last:0.25"``, for ``np_`` ranks
    on ``ceil(np_ / ppn)`` nodes."""
    nodes = -(-np_ // max(1, ppn))
    text = str(spec).strip()
    try:
        if text.startswith("last:"):
            speeds = [1.0] * (nodes - 1) + [float(text[5:])]
        else:
            speeds = [float(p) for p in text.split(",")]
    except ValueError:
        raise ScenarioError(f"node speed {spec!r}: expected numbers such as \"1,0.25\" or "
                            f"\"last:0.25\"") from None
    if len(speeds) != nodes:
        raise ScenarioError(f"node speed {spec!r} has {len(speeds)} speeds but runs use "
                            f"{nodes} nodes (write 'last:F' to slow the last node)")
    if any(not 0.01 <= s <= 1.0 for s in speeds):
        raise ScenarioError(f"node speed {spec!r}: each speed must be in [0.01, 1]")
    return tuple(speeds)


def _factor(text: str, spec: str) -> float:
    """One factor of a scenario's slowdown, by train's own rule (:func:`parse_factor`)."""
    try:
        return parse_factor(text, "slowdown", spec)
    except ValueError as exc:
        raise ScenarioError(str(exc)) from None


def flags_to_args(table: Any, where: str) -> tuple[str, ...]:
    """``{eval_every = 0.1, overlap = true}`` -> ``("--eval-every", "0.1", "--overlap")``."""
    if not isinstance(table, dict):
        raise ScenarioError(f"{where} must be a table of flag = value, got {table!r}")
    args: list[str] = []
    for key, value in table.items():
        name = str(key).replace("-", "_")
        if name in RESERVED_FLAGS:
            raise ScenarioError(f"{where}: '{key}' is set by the runner; use "
                                f"{RESERVED_FLAGS[name]}")
        flag = "--" + name.replace("_", "-")
        if name in OUT_DIR_FILES:
            _require(_bare_file_name(value),
                     f"{where}: '{key}' = {value!r} must be a file name: every run writes "
                     f"{OUT_DIR_FILES[name]} into the runner's --out-dir as <run id>-NAME "
                     "(an absolute path or a folder is refused)")
        if isinstance(value, bool):
            if value:
                args.append(flag)
            elif "--no-" + flag[2:] in negatable_train_flags():
                args.append("--no-" + flag[2:])  # off, whatever the switch's default
        elif isinstance(value, int | float | str):
            args += [flag, str(value)]
        elif isinstance(value, list) and all(isinstance(v, int | float | str) for v in value):
            args += [flag, ",".join(str(v) for v in value)]
        else:
            raise ScenarioError(f"{where}: '{key}' must be a string, number, boolean or list")
    return tuple(args)


@functools.cache
def negatable_train_flags() -> frozenset[str]:
    """Train's ``--no-X`` spellings: a scenario's ``X = false`` turns X off, also where X
    is on by default (Oscars' ``adaptive``); a plain ``store_true`` flag has none and
    ``false`` leaves it off."""
    from syncbench.bench.train.options import add_train_arguments

    parser = argparse.ArgumentParser(add_help=False)
    add_train_arguments(parser)
    return frozenset(name for action in parser._actions for name in action.option_strings
                     if name.startswith("--no-"))


def _bare_file_name(value: Any) -> bool:
    """Whether ``value`` names a file in the current folder, and only that: a string
    without a folder separator, not ``.`` or ``..``, no NUL."""
    return (isinstance(value, str) and value not in ("", ".", "..")
            and not any(c in value for c in "/\\\0"))


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ScenarioError(message)


def _number(data: dict, key: str, default: Any, kind: type, lo: float, hi: float) -> Any:
    value = data.get(key, default)
    good = isinstance(value, int | float) and not isinstance(value, bool)
    if kind is int:
        good = isinstance(value, int) and not isinstance(value, bool)
    _require(good and lo <= value <= hi,
             f"'{key}' must be a {'whole ' if kind is int else ''}number in [{lo:g}, {hi:g}], "
             f"got {value!r}")
    return kind(value)


def _lr_grid(value: Any, where: str) -> list[float]:
    _require(isinstance(value, list) and value and all(
        isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in value),
        f"{where}: 'lr_grid' must be a non-empty list of positive numbers, got {value!r}")
    return [float(v) for v in value]


def _entries(data: dict, top_grid: list[float] | None) -> list[RunEntry]:
    runs = data.get("run")
    _require(isinstance(runs, list) and runs and all(isinstance(r, dict) for r in runs),
             "needs at least one [[run]] table (label, algorithm, optional flags and lr_grid)")
    entries: list[RunEntry] = []
    for i, run in enumerate(runs):
        where = f"[[run]] #{i + 1}"
        unknown = sorted(set(run) - _RUN_KEYS)
        _require(not unknown, f"{where}: unknown key(s) {', '.join(unknown)}; "
                              f"valid: {', '.join(sorted(_RUN_KEYS))}")
        algorithm = run.get("algorithm")
        _require(isinstance(algorithm, str) and algorithm in ALGORITHMS,
                 f"{where}: 'algorithm' must be one of {', '.join(ALGORITHMS)}, "
                 f"got {algorithm!r}")
        label = run.get("label", algorithm)
        _require(isinstance(label, str) and label.strip() and label.replace("-", "").replace(
            "_", "").replace("+", "").replace(".", "").isalnum(),
            f"{where}: 'label' must be letters, digits and - _ + . only, got {label!r}")
        where = f"[[run]] {label!r}"
        flags = flags_to_args(run.get("flags", {}), f"{where} flags")
        grid = _lr_grid(run["lr_grid"], where) if "lr_grid" in run else top_grid
        if grid and len(grid) > 1:
            entries += [RunEntry(f"{label}@lr={lr:g}", algorithm,
                                 (*flags, "--lr", f"{lr:g}"), label, lr) for lr in grid]
        elif grid:
            entries.append(RunEntry(label, algorithm, (*flags, "--lr", f"{grid[0]:g}"),
                                    label, grid[0]))
        else:
            entries.append(RunEntry(label, algorithm, flags, label))
    labels = [e.label for e in entries]
    dupes = sorted({x for x in labels if labels.count(x) > 1})
    _require(not dupes, f"duplicate run label(s) {', '.join(dupes)}: every row needs its own")
    return entries


def parse_scenario(data: dict[str, Any], name: str, source: str) -> Scenario:
    """Check the parsed TOML of a scenario; :class:`ScenarioError` on the first problem."""
    unknown = sorted(set(data) - _TOP_KEYS)
    _require(not unknown, f"unknown key(s) {', '.join(unknown)}; "
                          f"valid: {', '.join(sorted(_TOP_KEYS))}")
    _require("np" in data, "'np' (ranks per run) is required")
    nps = _task_counts(data["np"])
    np_ = nps[0] if isinstance(data["np"], list) else _number(data, "np", None, int, 1,
                                                              MAX_RANKS)
    top_grid = _lr_grid(data["lr_grid"], "top level") if "lr_grid" in data else None
    entries = _entries(data, top_grid)
    headline = data.get("headline", "time_to_target")
    _require(headline in HEADLINES,
             f"'headline' must be one of {', '.join(HEADLINES)}, got {headline!r}")
    labels = [e.label for e in entries]
    baseline = data.get("baseline", labels[0])
    _require(baseline in labels,
             f"'baseline' {baseline!r} is not a run label (labels: {', '.join(labels)})")
    slowdowns = data.get("slowdowns", [])
    _require(isinstance(slowdowns, list) and all(isinstance(s, str) for s in slowdowns),
             "'slowdowns' must be a list of strings such as \"1,4\" or \"last:4\"")
    modes = data.get("slowdown_modes", [])
    _require(isinstance(modes, list) and all(m in SLOWDOWN_MODES for m in modes),
             f"'slowdown_modes' must be a list of {', '.join(SLOWDOWN_MODES)}, got {modes!r}")
    description = data.get("description", "")
    _require(isinstance(description, str), "'description' must be a string")
    speeds = data.get("node_speeds", [])
    _require(isinstance(speeds, list) and all(isinstance(s, str) for s in speeds),
             "'node_speeds' must be a list of strings such as \"1,0.25\" or \"last:0.25\"")
    cluster = _cluster_table(data.get("cluster", {}))
    _require(not {"target_accuracy", "target_loss"} <= set(data),
             "'target_accuracy' and 'target_loss': give one target (an accuracy for a "
             "classifier, a validation loss for a language model)")
    target_loss = (_number(data, "target_loss", None, float, 1e-9, 1e6)
                   if "target_loss" in data else None)
    scenario = Scenario(
        name=name, source=source, description=description, np=np_, runs=entries,
        repeats=_number(data, "repeats", 5, int, 1, 1000),
        target_accuracy=_number(data, "target_accuracy", 0.80, float, 1e-9, 1.0),
        headline=headline, baseline=baseline, target_loss=target_loss,
        eval_every=_number(data, "eval_every", 0.05, float, 0.0, 1e6),
        slowdowns=list(slowdowns), slowdown_modes=list(modes), node_speeds=list(speeds),
        cluster=cluster, flags=flags_to_args(data.get("flags", {}), "flags"),
        datasets=_datasets(data.get("datasets", [])),
        parity=_parity(data.get("parity", []), labels), raw=data)
    if isinstance(data["np"], list) or "scaling" in data:
        _scaling(scenario, data, nps)
    scenario.conditions(np_)  # checks every slowdown against np
    return scenario


def _task_counts(value: Any) -> tuple[int, ...]:
    """``np``: one whole number, or a list of distinct ones (a scaling scenario)."""
    values = value if isinstance(value, list) else [value]
    _require(bool(values) and all(isinstance(v, int) and not isinstance(v, bool)
                                  and 1 <= v <= MAX_RANKS for v in values),
             f"'np' must be a whole number in [1, {MAX_RANKS}] or a list of them, "
             f"got {value!r}")
    _require(len(set(values)) == len(values), f"'np' {value!r}: task counts repeat")
    return tuple(values)


def _scaling(scenario: Scenario, data: dict[str, Any], nps: tuple[int, ...]) -> None:
    """Check and set the keys of a scaling scenario (an ``np`` list)."""
    mode = data.get("scaling", "strong")
    _require(mode in SCALING_MODES,
             f"'scaling' must be one of {', '.join(SCALING_MODES)}, got {mode!r}")
    _require(not (scenario.heterogeneous or scenario.parity),
             "a scaling scenario (an 'np' list) takes no slowdowns, node_speeds or parity")
    for flags in (scenario.flags, *(e.flags for e in scenario.runs)):
        for name, key in SCALING_FLAGS.items():
            _require("--" + name.replace("_", "-") not in flags,
                     f"flag '{name}' is set per run by a scaling scenario; use {key}")
    scenario.nps, scenario.scaling = nps, mode
    # the batch of the other mode is not used; a value below 1 is refused by the plan
    scenario.global_batch = _number(data, "global_batch", 256, int, -(1 << 30), 1 << 30)
    scenario.batch_size = _number(data, "batch_size", 64, int, -(1 << 30), 1 << 30)


def _datasets(value: Any) -> list[str]:
    """The checked ``datasets`` preference list."""
    _require(isinstance(value, list) and all(v in DATASETS for v in value),
             f"'datasets' must be a list of {', '.join(DATASETS)}, got {value!r}")
    return list(value)


def _parity(value: Any, labels: list[str]) -> list[dict[str, str]]:
    """The checked ``[[parity]]`` tables: a name and two run labels each."""
    _require(isinstance(value, list) and all(isinstance(t, dict) for t in value),
             "'parity' must be [[parity]] tables of name, ssgd and odsgd")
    for table in value:
        _require(set(table) == _PARITY_KEYS,
                 f"[[parity]] needs exactly the keys {', '.join(sorted(_PARITY_KEYS))}, "
                 f"got {', '.join(sorted(table))}")
        for key in ("ssgd", "odsgd"):
            _require(table[key] in labels,
                     f"[[parity]] {table['name']!r}: {key} = {table[key]!r} is not a run label")
    return [dict(t) for t in value]


def resolve_dataset(datasets: list[str]) -> str | None:
    """The first of ``datasets`` whose files are found (the last one if none is), else None."""
    if not datasets:
        return None
    for name in datasets:
        try:
            find_dataset_dir(name)
        except DatasetError:
            continue
        return name
    return datasets[-1]


def _cluster_table(table: Any) -> dict[str, Any]:
    """The checked ``cluster = { link = "1gbit", ppn = 1 }`` table."""
    _require(isinstance(table, dict), "'cluster' must be a table such as { link = \"1gbit\" }")
    unknown = sorted(set(table) - _CLUSTER_KEYS)
    _require(not unknown, f"cluster: unknown key(s) {', '.join(unknown)}; valid: "
                          f"{', '.join(sorted(_CLUSTER_KEYS))}")
    if "link" in table:
        _require(isinstance(table["link"], str) and RATE.match(table["link"]) is not None,
                 f"cluster: 'link' must be a rate such as \"1gbit\", got {table['link']!r}")
    ppn = table.get("ppn", 1)
    _require(isinstance(ppn, int) and not isinstance(ppn, bool) and ppn >= 1,
             f"cluster: 'ppn' must be a whole number >= 1, got {ppn!r}")
    return dict(table)


def load_scenario(spec: str) -> Scenario:
    """A shipped scenario by name (``hetero``) or any scenario file by path."""
    shipped = shipped_scenarios()
    if spec in shipped:
        path = shipped[spec]
    else:
        path = Path(spec)
        if not path.is_file():
            names = ", ".join(shipped)
            raise ScenarioError(f"{spec}: no such scenario file (shipped scenarios: {names})")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioError(f"{path}: cannot be read ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: not valid TOML ({exc})") from None
    try:
        return parse_scenario(data, path.stem, str(path))
    except ScenarioError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
