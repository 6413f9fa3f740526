"""``syncbench report --compare A B``: what changed from one set of runs to another.

A and B are each a results file (the runner's ``results.json``, a sweep's
``manifest.json``: ``syncbench-results/1``, or an older ``syncbench-sweep/1``
manifest), a folder of run files, or a (quoted) glob of them. Runs are paired by
what their run files record, never by their names (:func:`run_identity`): the
strategy (with its variant), model, dataset, ranks, batch, budget and every flag
that changes the work; a results record whose run file is gone is known by its
label and condition only. What one side has and the other lacks is named on
stderr, one line a side, and not compared; with ``--fail-on-change``, nothing
compared at all is exit 2. A results file's recorded figures are used as they
are; a manifest's, which records none, are read from its run files. Incomplete
runs are left out. Time to target of runs trained without a target is "n/a"
(undefined), never infinitely slow.

For samples/s, time to target and every other registry column with a spread
(:mod:`.columns`, combined as :mod:`.repeats` does: a diverged run is left out
of speeds, a missed target counts as infinitely slow) a row gives the ratio of
medians B/A with the min–max of every pairwise ratio b/a, and a two-sided
Mann-Whitney U test of the two sets of per-run values (Mann & Whitney 1947;
as asv's ``asv compare``, asv/statistics.py: exact when neither side has more
than 20 runs, here only without ties; otherwise the normal approximation with
the tie correction and a continuity correction, as scipy.stats.mannwhitneyu's
asymptotic method). A change is flagged only when it is significant
(p < ``alpha``) and larger than ``threshold`` (|B/A - 1|), as asv flags only
changes beyond ``--factor``; when no arrangement of the runs can reach
p < alpha (2 / C(m + n, m) >= alpha: 2 runs a side gives 1/3) the row says
"n too small" rather than guess.
"""

from __future__ import annotations

import argparse
import csv
import functools
import glob
import io
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import columns
from .fairness import nominal_factors
from .inputs import RAN, InputError, load_results, record_path, results_in
from .labels import run_label
from .numbers import hashable
from .repeats import format_value, spread
from .runfile import RunFileError, read_run
from .scaling import NON_IDENTITY_FLAGS, other_strategy_flags
from .tables import table_rows
from .targets import Target, loss_target_problem, target_of, target_problem

#: The headline figures, first in the table.
HEADLINE = ("samples_per_s", "time_to_target_s")
#: Sample sizes up to which the p-value is exact (asv's switch), if there are no ties.
EXACT_MAX = 20
DEFAULT_ALPHA = 0.05
DEFAULT_THRESHOLD = 0.1



class CompareError(Exception):
    """An input that cannot be compared; the message is one line naming it."""


# ---------------------------------------------------------------- Mann-Whitney U


@dataclass(frozen=True)
class UTest:
    """A two-sided Mann-Whitney U test of B against A."""

    #: U of B: pairs (a, b) with b > a, a tie counting one half (0 .. m n).
    u: float
    p: float
    #: "exact" or "normal".
    method: str


@functools.cache
def _u_counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m + n, m) orders of m + n distinct values give each U, 0 .. m n.

    The largest value is one of the m (it beats all n: U = n + U(m - 1, n)) or one of
    the n (U = U(m, n - 1)): Mann & Whitney's recursion.
    """
    if m == 0 or n == 0:
        return (1,)
    out = [0] * (m * n + 1)
    for u, count in enumerate(_u_counts(m - 1, n)):
        out[u + n] += count
    for u, count in enumerate(_u_counts(m, n - 1)):
        out[u] += count
    return tuple(out)


def exact_p(u: float, m: int, n: int) -> float:
    """Two-sided exact p of U = ``u`` for samples of ``m`` and ``n`` distinct values:
    2 P(U <= min(u, m n - u)), at most 1."""
    counts = _u_counts(m, n)
    tail = int(min(u, m * n - u))
    return min(1.0, 2.0 * sum(counts[: tail + 1]) / math.comb(m + n, m))


def normal_p(u: float, m: int, n: int, tie_sizes: Iterable[int] = ()) -> float:
    """Two-sided p of U = ``u`` from the normal approximation, with the tie correction
    (``tie_sizes``: how many values share each tied value) and a continuity correction."""
    total = m + n
    ties = sum(t**3 - t for t in tie_sizes)
    var = m * n / 12.0 * ((total + 1) - ties / (total * (total - 1)))
    if var <= 0:  # every value the same
        return 1.0
    z = (abs(u - m * n / 2.0) - 0.5) / math.sqrt(var)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2.0)))


def mann_whitney_u(a: Sequence[float], b: Sequence[float], method: str = "auto") -> UTest:
    """U of ``b`` against ``a`` and the two-sided p (``method``: auto, exact or normal;
    auto is exact without ties when neither side has more than :data:`EXACT_MAX`)."""
    m, n = len(a), len(b)
    if m == 0 or n == 0:
        raise ValueError("mann_whitney_u needs at least one value on each side")
    both = np.concatenate([np.asarray(a, dtype=float), np.asarray(b, dtype=float)])
    values, inverse, sizes = np.unique(both, return_inverse=True, return_counts=True)
    ends = np.cumsum(sizes)
    midranks = (ends - (sizes - 1) / 2.0)[inverse]  # ties share their mean rank
    u = float(midranks[m:].sum() - n * (n + 1) / 2.0)
    tied = bool((sizes > 1).any())
    if method == "auto":
        method = "exact" if not tied and max(m, n) <= EXACT_MAX else "normal"
    if method == "exact":
        if tied:
            raise ValueError("the exact p-value needs values without ties")
        return UTest(u, exact_p(u, m, n), "exact")
    if method == "normal":
        return UTest(u, normal_p(u, m, n, (int(t) for t in sizes if t > 1)), "normal")
    raise ValueError(f"unknown method {method!r}; valid: auto, exact, normal")


def smallest_p(m: int, n: int) -> float:
    """The smallest two-sided p any ``m`` and ``n`` runs can give: 2 / C(m + n, m)."""
    return min(1.0, 2.0 / math.comb(m + n, m))


# ---------------------------------------------------------------- the sets of runs

#: Root attributes of a run's identity (with its strategy's label and its world size).
IDENTITY_ATTRS = ("model", "dataset", "simulated")
#: ``config`` flags of a run's identity beyond the work flags (which
#: ``scaling.NON_IDENTITY_FLAGS`` leaves out of a series, the batch and budget too).
IDENTITY_FLAGS = ("batch_size", "epochs")
#: The identity entries a configuration's name shows (the label is shown apart).
SHOWN = ("model", "dataset", "world_size", "batch_size", "slowdown")

Identity = tuple[tuple[str, Any], ...]


def run_identity(label: str, attrs: dict[str, Any], config: dict[str, Any],
                 world_size: Any, nominal: tuple[float, ...] = ()) -> Identity:
    """What two runs must share to be compared: the strategy (its label, variant
    suffix included), model, dataset, ranks, batch, budget, every flag that changes
    the work or how it is synchronised (a strategy's own options, slowdowns; not the
    seed, the outputs, the evaluation interval or the target) and each rank's nominal
    slowdown (``--slowdown`` and its node's CPU share, ``fairness.nominal_factors``)."""
    others = other_strategy_flags(attrs)
    key: list[tuple[str, Any]] = [("strategy", label), ("world_size", int(world_size)),
                                  ("nominal", tuple(nominal))]
    key += [(k, hashable(attrs.get(k))) for k in IDENTITY_ATTRS]
    key += [(k, hashable(config.get(k))) for k in IDENTITY_FLAGS]
    key += [(k, hashable(v)) for k, v in sorted(config.items())
            if k not in NON_IDENTITY_FLAGS and not k.startswith("_") and k not in others]
    return tuple(key)


def _shown(identity: Identity) -> str:
    """A configuration's name: model/dataset, ranks, batch, slowdown."""
    d = dict(identity)
    if "strategy" not in d:  # a results record whose run file is gone: its condition
        return str(d.get("condition"))
    parts = [f"{d.get('model')}/{d.get('dataset')}", f"np={d.get('world_size')}",
             f"batch={d.get('batch_size')}"]
    if d.get("slowdown"):
        parts.append(f"slowdown={d['slowdown']}")
    return " ".join(parts)


@dataclass
class RunSet:
    """One side of a comparison: per run identity (:func:`run_identity`), per figure,
    per-run values."""

    source: str
    values: dict[Identity, dict[str, list[float]]] = field(default_factory=dict)
    runs: int = 0
    #: Incomplete runs (and a sweep's failed or pending ones), left out.
    left_out: int = 0
    #: Identity -> the label its runs are shown under (a results file's own label).
    labels: dict[Identity, str] = field(default_factory=dict)
    #: Identity -> figures none of its runs has (time to target without a target).
    lacks: dict[Identity, set[str]] = field(default_factory=dict)


def figures() -> tuple[str, ...]:
    """The compared figures: :data:`HEADLINE`, then every report column with a spread."""
    rest = [c.key for c in columns.row_columns() if c.spread and c.key not in HEADLINE]
    return (*HEADLINE, *rest)


def run_value(key: str, value: Any, diverged: bool) -> float | None:
    """A run's value of figure ``key`` as :mod:`.repeats` counts it: None (left out) when
    it is missing or the run diverged where the column says so; infinity for a missed
    time to target."""
    entry = columns.column(key)
    slow = entry is not None and entry.missing_is_slow
    if diverged and (slow or (entry is not None and entry.diverged_excluded)):
        return math.inf if slow else None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if math.isnan(number):
        return math.inf if slow else None
    return number


def _targeted(key: str) -> bool:
    """Whether figure ``key`` needs a target (time to target: a miss is infinitely slow)."""
    entry = columns.column(key)
    return entry is not None and entry.missing_is_slow


def _add(run_set: RunSet, key: Identity, label: str, figures_of: dict[str, Any],
         diverged: bool, complete: Any, has_target: bool = True) -> None:
    run_set.runs += 1
    run_set.labels.setdefault(key, label)
    if complete is False:
        run_set.left_out += 1
        return
    per_figure = run_set.values.setdefault(key, {})
    for name in figures():
        if not has_target and _targeted(name):  # undefined, not infinitely slow
            run_set.lacks.setdefault(key, set()).add(name)
            continue
        value = run_value(name, figures_of.get(name), diverged)
        if value is not None:
            per_figure.setdefault(name, []).append(value)


def _row_identity(row: dict[str, Any]) -> Identity:
    label = str(row.get("algorithm") or "")
    return run_identity(label, row.get("_attrs", {}), row.get("_config", {}),
                        row.get("world_size"), row.get("_nominal", ()))


def _read_runs(paths: Sequence[str], target: float | Target | None) -> list[dict[str, Any]]:
    try:
        runs = [read_run(p) for p in paths]
    except RunFileError as exc:
        raise CompareError(str(exc)) from None
    if not isinstance(target, Target):
        return table_rows(runs, target_accuracy=target)
    if target.metric == "loss" and (problem := loss_target_problem(runs)):
        raise CompareError(problem)
    return table_rows(runs, **target.kwargs())


def _has_target(row: dict[str, Any]) -> bool:
    return row.get("target_accuracy") is not None or row.get("target_loss") is not None


def _from_run_files(source: str, paths: Sequence[str],
                    target: float | Target | None) -> RunSet:
    run_set = RunSet(source)
    for row in _read_runs(paths, target):
        _add(run_set, _row_identity(row), str(row.get("algorithm") or ""), row,
             bool(row.get("diverged")), row.get("complete"),
             _has_target(row))
    return run_set


def _record_identity(record: dict[str, Any], path: Path,
                     read: dict[str, Identity]) -> Identity:
    """A results record's identity, from its run file's attributes; a record whose run
    file is gone is known only by its label and condition (it pairs with such records)."""
    file = record_path(record, path)
    if file not in read:
        if not Path(file).is_file():
            return (("label", str(record.get("label") or record.get("algorithm") or "")),
                    ("condition", str(record.get("condition", f"np={record.get('np')}"))))
        try:
            run = read_run(file)
        except RunFileError as exc:
            raise CompareError(f"{path}: {exc}") from None
        nominal = tuple(round(f, 6) for _, f in sorted(nominal_factors(run).items()))
        read[file] = run_identity(run_label(run.attrs), run.attrs, run.config,
                                  run.world_size, nominal)
    return read[file]


def _from_results(path: Path, target: float | Target | None) -> RunSet:
    """The runs of a results file: its recorded figures, or (a manifest) its run files'."""
    try:
        records = [r for r in load_results(path)["runs"] if isinstance(r, dict)]
    except InputError as exc:
        raise CompareError(str(exc)) from None
    recorded = [r for r in records if HEADLINE[0] in r]
    if recorded and target is not None:
        flag = target.flag if isinstance(target, Target) else "--target-accuracy"
        raise CompareError(f"{flag}: {path} records its figures at its own "
                           "target; compare its folder of run files instead")
    run_set = RunSet(str(path))
    read: dict[str, Identity] = {}
    for record in recorded:
        figures_of = {**(record.get("summary") or {}), **record}
        label = str(record.get("label") or record.get("algorithm") or "")
        _add(run_set, _record_identity(record, path, read), label, figures_of,
             bool(record.get("diverged")), record.get("complete"))
    files = [r for r in records if r not in recorded and r.get("status") in RAN]
    missed = len(records) - len(recorded) - len(files)  # a sweep's failed or pending runs
    run_set.runs += missed
    run_set.left_out += missed
    if files:
        paths = [record_path(r, path) for r in files]
        for file in paths:
            if not Path(file).is_file():
                raise CompareError(f"{path}: no run file {file}")
        for row in _read_runs(paths, target):
            _add(run_set, _row_identity(row), str(row.get("algorithm") or ""), row,
                 bool(row.get("diverged")), row.get("complete"),
                 _has_target(row))
    return run_set


def load_set(spec: str, target: float | Target | None = None) -> RunSet:
    """A results file, a folder of run files (else its results.json / manifest.json),
    or a glob of run files; :class:`CompareError` with one line if it is none.
    ``target`` (a float: an accuracy) recomputes the runs' time to target."""
    path = Path(spec)
    if path.is_dir():
        paths = sorted(str(p) for p in path.glob("*.h5"))
        if paths:
            return _from_run_files(spec, paths, target)
        results = results_in(path)
        if results is not None:
            return _from_results(results, target)
        raise CompareError(f"{spec}: a folder with no run files (*.h5) and no results.json")
    if path.is_file():
        if path.suffix == ".json":
            return _from_results(path, target)
        return _from_run_files(spec, [spec], target)
    paths = sorted(glob.glob(spec))
    if not paths:
        raise CompareError(f"{spec}: no such file, folder or run files")
    return _from_run_files(spec, paths, target)


# ---------------------------------------------------------------- the comparison


@dataclass(frozen=True)
class Change:
    """One figure of one label and configuration, A against B."""

    label: str
    configuration: str
    figure: str
    a: dict[str, Any]
    b: dict[str, Any]
    #: Median of B / median of A, and the min and max of every pairwise b / a (NaN: none).
    ratio: float
    ratio_min: float
    ratio_max: float
    test: UTest
    #: changed, within threshold, not significant, n too small, or no ratio.
    verdict: str


def _ratio(num: float, den: float) -> float:
    """num / den; infinite for a figure that became infinite (a target B never reached),
    NaN for a zero denominator or infinity on both sides."""
    if den == 0 or math.isnan(num) or math.isnan(den) or (math.isinf(num) and math.isinf(den)):
        return math.nan
    return num / den


def _verdict(ratio: float, test: UTest, m: int, n: int, alpha: float, threshold: float) -> str:
    if smallest_p(m, n) >= alpha:
        return "n too small"
    if test.p >= alpha:
        return "not significant"
    if math.isnan(ratio):
        return "no ratio"
    return "changed" if abs(ratio - 1.0) > threshold else "within threshold"


def compare_values(key: tuple[str, str, str], a: Sequence[float], b: Sequence[float],
                   alpha: float = DEFAULT_ALPHA,
                   threshold: float = DEFAULT_THRESHOLD) -> Change:
    """The :class:`Change` of one figure from values ``a`` to values ``b`` (both non-empty)."""
    sa, sb = spread(a, keep_inf=True), spread(b, keep_inf=True)
    pairwise = np.array([_ratio(y, x) for x in a for y in b])
    pairwise = pairwise[~np.isnan(pairwise)]
    lo, hi = (float(pairwise.min()), float(pairwise.max())) if pairwise.size else \
        (math.nan, math.nan)
    ratio = _ratio(sb["median"], sa["median"])
    test = mann_whitney_u(a, b)
    verdict = _verdict(ratio, test, len(a), len(b), alpha, threshold)
    return Change(*key, sa, sb, ratio, lo, hi, test, verdict)


@dataclass
class Comparison:
    """Every :class:`Change` of two sets, and the labels and configurations of one only."""

    a: RunSet
    b: RunSet
    alpha: float
    threshold: float
    changes: list[Change]
    only_a: list[Identity]
    only_b: list[Identity]

    @property
    def changed(self) -> list[Change]:
        return [c for c in self.changes if c.verdict == "changed"]


def check_levels(alpha: float, threshold: float) -> None:
    """``ValueError`` unless 0 < ``alpha`` < 1 and ``threshold`` >= 0."""
    if not 0 < alpha < 1:
        raise ValueError(f"--alpha must be between 0 and 1, got {alpha:g}")
    if not threshold >= 0:
        raise ValueError(f"--threshold must be >= 0, got {threshold:g}")


def _lacking(key: tuple[str, str, str], a: Sequence[float], b: Sequence[float]) -> Change:
    """A figure one side has and the other has not (time to target of runs trained
    without a target): no ratio, no test, "n/a"."""
    nan = math.nan
    return Change(*key, spread(a, keep_inf=True), spread(b, keep_inf=True), nan, nan, nan,
                  UTest(nan, nan, "none"), "n/a")


def compare_sets(a: RunSet, b: RunSet, alpha: float = DEFAULT_ALPHA,
                 threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    """Each figure of each run identity that both sets have values of; a headline figure
    one side lacks (no target: time to target undefined) is "n/a"."""
    check_levels(alpha, threshold)
    changes = []
    for key in sorted(set(a.values) & set(b.values), key=repr):
        names = (a.labels.get(key) or b.labels.get(key) or "", _shown(key))
        for name in figures():
            va, vb = a.values[key].get(name), b.values[key].get(name)
            if va and vb:
                changes.append(compare_values((*names, name), va, vb, alpha, threshold))
            elif (va or vb) and name in HEADLINE:
                changes.append(_lacking((*names, name), va or [], vb or []))
            elif name in HEADLINE and (name in a.lacks.get(key, ())
                                       or name in b.lacks.get(key, ())):
                changes.append(_lacking((*names, name), [], []))
    return Comparison(a, b, alpha, threshold, changes,
                      sorted(set(a.values) - set(b.values), key=repr),
                      sorted(set(b.values) - set(a.values), key=repr))


def _differences(key: Identity, others: Sequence[Identity]) -> str:
    """How ``key`` differs from the nearest of ``others`` (fewest differing entries)."""
    if not others:
        return "the other side has no runs"
    mine = dict(key)

    def diff(other: Identity) -> list[str]:
        theirs = dict(other)
        return [f"{k} {mine.get(k)!s} vs {theirs.get(k)!s}"
                for k in dict.fromkeys([*mine, *theirs]) if mine.get(k) != theirs.get(k)]

    nearest = min((diff(o) for o in others), key=len)
    shown = ", ".join(nearest[:4]) + (f" and {len(nearest) - 4} more" if len(nearest) > 4 else "")
    return f"nearest differs in {shown}"


def unmatched_lines(comparison: Comparison) -> list[str]:
    """One warning per side with runs the other side has no run of the same identity."""
    c = comparison
    lines = []
    for side, run_set, keys, other in (("A", c.a, c.only_a, c.b), ("B", c.b, c.only_b, c.a)):
        if not keys:
            continue
        what = "; ".join(f"{run_set.labels.get(k, '')} {_shown(k)}" for k in keys)
        lines.append(f"warning: {side} ({run_set.source}) has {len(keys)} run identity(ies) "
                     f"the other side lacks, not compared: {what} "
                     f"({_differences(keys[0], list(other.values))})")
    return lines


# ---------------------------------------------------------------- output

HEADERS = ("label", "configuration", "figure", "A median", "B median", "B/A (min–max)",
           "nA", "nB", "U", "p", "result")


def _median_cell(figure: str, stats: dict[str, Any]) -> str:
    if not stats["n"]:
        return "n/a"
    value = stats["median"]
    spec = columns.format_spec(figure)
    if value is None or math.isinf(value) or spec is None:
        return format_value(value)
    return spec.format(value)


def _ratio_cell(change: Change) -> str:
    if math.isnan(change.ratio):
        return "-"
    text = format_value(change.ratio)
    if math.isnan(change.ratio_min) or change.ratio_min == change.ratio_max:
        return text
    return f"{text} ({format_value(change.ratio_min)}–{format_value(change.ratio_max)})"


def _cells(change: Change) -> list[str]:
    return [change.label, change.configuration, change.figure,
            _median_cell(change.figure, change.a), _median_cell(change.figure, change.b),
            _ratio_cell(change), str(change.a["n"]), str(change.b["n"]),
            "-" if math.isnan(change.test.u) else f"{change.test.u:g}",
            "-" if math.isnan(change.test.p) else f"{change.test.p:.3g}", change.verdict]


def _fixed(rows: list[list[str]]) -> list[str]:
    """Fixed-width columns: text left-aligned, the numbers (from A median on) right."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) if i < 3 or i == len(r) - 1 else c.rjust(w)
                      for i, (c, w) in enumerate(zip(r, widths, strict=True))).rstrip()
            for r in rows]


def _describe(run_set: RunSet, side: str) -> str:
    left = (f", {run_set.left_out} incomplete or not run, left out" if run_set.left_out
            else "")
    return f"{side} = {run_set.source} ({run_set.runs} runs{left})"


def format_text(comparison: Comparison) -> str:
    """The fixed-column table, headed by what was compared and how, and its verdict."""
    c = comparison
    lines = [f"# syncbench report --compare: {_describe(c.a, 'A')}, {_describe(c.b, 'B')}",
             "# B/A: ratio of the medians over repeats (min–max: of every pairwise b/a); "
             "p: two-sided Mann-Whitney U",
             f"# changed: p < {c.alpha:g} and |B/A - 1| > {c.threshold:g}; n too small: "
             f"so few runs cannot reach p < {c.alpha:g}"]
    if c.changes:
        lines += _fixed([list(HEADERS), *(_cells(ch) for ch in c.changes)])
    else:
        lines.append("# no run on both sides is the same work (strategy, model, dataset, "
                     "ranks, batch and flags): nothing compared")
    for side, keys in (("A", c.only_a), ("B", c.only_b)):
        if keys:
            run_set = c.a if side == "A" else c.b
            lines.append(f"# only in {side}: " + ", ".join(
                f"{run_set.labels.get(k, '')} {_shown(k)}" for k in keys))
    if any(ch.verdict == "n/a" for ch in c.changes):
        lines.append("# n/a: a side has no value (time to target of runs trained without "
                     "a target: undefined, not slower; --target-accuracy X or --target-loss X "
                     "sets one for run files)")
    changed = c.changed
    summary = ", ".join(f"{ch.label} {ch.configuration} {ch.figure} x{ch.ratio:.2f}"
                        for ch in changed)
    lines.append(f"# {len(changed)} changed: {summary}" if changed else "# no change flagged")
    return "\n".join(lines)


#: The keys of a row of the csv and json outputs.
RECORD_KEYS = ("label", "configuration", "figure", "a_median", "b_median", "n_a", "n_b",
               "ratio", "ratio_min", "ratio_max", "u", "p", "method", "result")


def _record(change: Change) -> dict[str, Any]:
    def plain(value: float) -> float | None:
        return None if value is None or not math.isfinite(value) else value

    return {"label": change.label, "configuration": change.configuration,
            "figure": change.figure, "a_median": plain(change.a["median"]),
            "b_median": plain(change.b["median"]), "n_a": change.a["n"], "n_b": change.b["n"],
            "ratio": plain(change.ratio), "ratio_min": plain(change.ratio_min),
            "ratio_max": plain(change.ratio_max), "u": plain(change.test.u),
            "p": plain(change.test.p),
            "method": change.test.method, "result": change.verdict}


def format_comparison(comparison: Comparison, fmt: str = "md") -> str:
    """``md``: :func:`format_text`; ``csv`` / ``json``: one record per row (NaN: empty /
    null)."""
    if fmt == "md":
        return format_text(comparison)
    records = [_record(ch) for ch in comparison.changes]
    if fmt == "json":
        return json.dumps(records, indent=2, allow_nan=False)
    if fmt == "csv":
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(RECORD_KEYS)
        for r in records:
            writer.writerow(["" if v is None else v for v in r.values()])
        return out.getvalue().rstrip("\n")
    raise ValueError(f"unknown format {fmt!r}; valid formats: md, csv, json")


#: ``syncbench report`` flags that do not apply to ``--compare`` (attribute, flag).
NOT_WITH_COMPARE = (("by", "--by"), ("series", "--series"), ("plots", "--plots"),
                    ("per_rank", "--per-rank"), ("timeline_steps", "--timeline-steps"),
                    ("per_run_plots", "--per-run-plots"))
#: Output formats of ``--compare``.
COMPARE_FORMATS = ("md", "csv", "json")


def compare_main(args: argparse.Namespace, err: Callable[[str], None]) -> int:
    """``syncbench report --compare A B``: 0; 1 with ``--fail-on-change`` when a change is
    flagged; 2 (one line through ``err``) on bad input."""
    try:
        refused = [flag for attr, flag in NOT_WITH_COMPARE if getattr(args, attr, None)]
        if refused:
            raise CompareError(f"{refused[0]} does not apply to --compare")
        if args.format not in COMPARE_FORMATS:
            raise CompareError(f"--format {args.format} does not apply to --compare "
                               f"({', '.join(COMPARE_FORMATS)})")
        if len(args.runs) != 2:
            raise CompareError(f"--compare takes two sets, A and B (a results file, a "
                               f"folder of run files or a quoted glob), got {len(args.runs)}")
        check_levels(args.alpha, args.threshold)
        accuracy = getattr(args, "target_accuracy", None)
        loss = getattr(args, "target_loss", None)
        problem = target_problem(accuracy, loss)
        if problem:
            raise CompareError(problem)
        target = target_of(accuracy, loss)
        sets = [load_set(spec, target) for spec in args.runs]
        comparison = compare_sets(*sets, alpha=args.alpha, threshold=args.threshold)
    except (CompareError, ValueError) as exc:
        err(str(exc))
        return 2
    for line in unmatched_lines(comparison):
        err(line)
    text = format_comparison(comparison, args.format)
    output = getattr(args, "output", None)
    if output:
        from syncbench.bench.files import WriteError, write_atomic

        try:
            write_atomic(output, (text + "\n").encode())
        except WriteError as exc:
            err(str(exc))
            return 2
    else:
        print(text)
    fail = getattr(args, "fail_on_change", False)
    if fail and not any(c.verdict != "n/a" for c in comparison.changes):
        err(f"--fail-on-change: nothing could be compared: no run of {args.runs[0]} is the "
            f"same work as a run of {args.runs[1]} (strategy, model, dataset, ranks, batch "
            "and flags)")
        return 2
    return 1 if fail and comparison.changed else 0


def add_compare_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``syncbench report --compare``."""
    parser.add_argument("--compare", action="store_true",
                        help="compare two sets of runs, A B (each a results.json or "
                        "manifest.json, a folder of run files or a quoted glob): B/A of the "
                        "medians per label and configuration, Mann-Whitney U p-values")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA,
                        help=f"--compare: significance level (default {DEFAULT_ALPHA:g})")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="--compare: flag only changes with |B/A - 1| above this "
                        f"(default {DEFAULT_THRESHOLD:g}: 10%%)")
    parser.add_argument("--fail-on-change", action="store_true",
                        help="--compare: exit 1 when a change is flagged")
