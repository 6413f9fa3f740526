"""``syncbench report --compare A B``: what changed from one set of runs to another.

A and B are each a results file (the runner's ``results.json``, a sweep's
``manifest.json``: ``syncbench-results/1``, or an older ``syncbench-sweep/1``
manifest), a folder of run files, or a (quoted) glob of them. Runs are matched
per label and configuration: a results file's label and condition (a sweep's:
``np=N``), a run file's label and its name less the ``-r<repeat>`` suffix (the
runner's and a sweep's naming, ``<label>-<configuration>-r<repeat>``). A results
file's recorded figures are used as they are; a manifest's, which records
none, are read from its run files. Incomplete runs are left out.

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
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import columns
from .repeats import format_value, spread
from .runfile import RunFileError, read_run
from .tables import table_rows

#: Results files read (the runner's and a scaling scenario's; an older sweep manifest).
RESULTS_SCHEMAS = ("syncbench-results/1", "syncbench-sweep/1")
#: The headline figures, first in the table.
HEADLINE = ("samples_per_s", "time_to_target_s")
#: A sweep's statuses of a run whose run file is there (it ran, or was kept from before).
RAN = ("ran", "skipped")
#: Sample sizes up to which the p-value is exact (asv's switch), if there are no ties.
EXACT_MAX = 20
DEFAULT_ALPHA = 0.05
DEFAULT_THRESHOLD = 0.1

Key = tuple[str, str]


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


@dataclass
class RunSet:
    """One side of a comparison: per (label, configuration), per figure, per-run values."""

    source: str
    values: dict[Key, dict[str, list[float]]] = field(default_factory=dict)
    runs: int = 0
    #: Incomplete runs (and a sweep's failed or pending ones), left out.
    left_out: int = 0


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


def _add(run_set: RunSet, key: Key, figures_of: dict[str, Any], diverged: bool,
         complete: Any) -> None:
    run_set.runs += 1
    if complete is False:
        run_set.left_out += 1
        return
    per_figure = run_set.values.setdefault(key, {})
    for name in figures():
        value = run_value(name, figures_of.get(name), diverged)
        if value is not None:
            per_figure.setdefault(name, []).append(value)


def _configuration(path: str, label: str) -> str:
    """A run file's configuration: its name less ``-r<repeat>`` and a leading label."""
    stem = re.sub(r"-r\d+$", "", Path(path).stem)
    return stem[len(label) + 1:] if stem.startswith(f"{label}-") else stem


def _read_runs(paths: Sequence[str], target: float | None) -> list[dict[str, Any]]:
    try:
        runs = [read_run(p) for p in paths]
    except RunFileError as exc:
        raise CompareError(str(exc)) from None
    return table_rows(runs, target_accuracy=target)


def _from_run_files(source: str, paths: Sequence[str], target: float | None) -> RunSet:
    run_set = RunSet(source)
    for path, row in zip(paths, _read_runs(paths, target), strict=True):
        label = str(row.get("algorithm") or "")
        _add(run_set, (label, _configuration(path, label)), row, bool(row.get("diverged")),
             row.get("complete"))
    return run_set


def _record_path(record: dict[str, Any], results: Path) -> str:
    path = Path(str(record.get("path") or ""))
    # results files name their run files relative to their own folder (older ones: to
    # where the runner was started, tried second)
    if not path.is_absolute() and (results.parent / path).exists():
        path = results.parent / path
    if not path.is_file():
        raise CompareError(f"{results}: run {record.get('run_id', path.stem)}: "
                           f"no run file {path}")
    return str(path)


def _record_key(record: dict[str, Any]) -> Key:
    label = str(record.get("label") or record.get("algorithm") or "")
    if "condition" in record:
        return label, str(record["condition"])
    return label, f"np={record.get('np')}"


def _load_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CompareError(f"{path}: not a results file (not JSON: {exc})") from None
    except OSError as exc:
        raise CompareError(f"{path}: cannot be read ({exc.strerror})") from None
    schema = data.get("schema") if isinstance(data, dict) else None
    if schema not in RESULTS_SCHEMAS or not isinstance(data.get("runs"), list):
        raise CompareError(f"{path}: not a results file (schema {schema!r}; expected "
                           f"{' or '.join(RESULTS_SCHEMAS)} with runs)")
    return data


def _from_results(path: Path, target: float | None) -> RunSet:
    """The runs of a results file: its recorded figures, or (a manifest) its run files'."""
    records = [r for r in _load_json(path)["runs"] if isinstance(r, dict)]
    recorded = [r for r in records if HEADLINE[0] in r]
    if recorded and target is not None:
        raise CompareError(f"--target-accuracy: {path} records its figures at its own "
                           "target; compare its folder of run files instead")
    run_set = RunSet(str(path))
    for record in recorded:
        figures_of = {**(record.get("summary") or {}), **record}
        _add(run_set, _record_key(record), figures_of, bool(record.get("diverged")),
             record.get("complete"))
    files = [r for r in records if r not in recorded and r.get("status") in RAN]
    missed = len(records) - len(recorded) - len(files)  # a sweep's failed or pending runs
    run_set.runs += missed
    run_set.left_out += missed
    if files:
        paths = [_record_path(r, path) for r in files]
        for record, row in zip(files, _read_runs(paths, target), strict=True):
            _add(run_set, _record_key(record), row, bool(row.get("diverged")),
                 row.get("complete"))
    return run_set


def load_set(spec: str, target: float | None = None) -> RunSet:
    """A results file, a folder of run files (else its results.json / manifest.json),
    or a glob of run files; :class:`CompareError` with one line if it is none."""
    path = Path(spec)
    if path.is_dir():
        paths = sorted(str(p) for p in path.glob("*.h5"))
        if paths:
            return _from_run_files(spec, paths, target)
        for name in ("results.json", "manifest.json"):
            if (path / name).is_file():
                return _from_results(path / name, target)
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
    only_a: list[Key]
    only_b: list[Key]

    @property
    def changed(self) -> list[Change]:
        return [c for c in self.changes if c.verdict == "changed"]


def check_levels(alpha: float, threshold: float) -> None:
    """``ValueError`` unless 0 < ``alpha`` < 1 and ``threshold`` >= 0."""
    if not 0 < alpha < 1:
        raise ValueError(f"--alpha must be between 0 and 1, got {alpha:g}")
    if not threshold >= 0:
        raise ValueError(f"--threshold must be >= 0, got {threshold:g}")


def compare_sets(a: RunSet, b: RunSet, alpha: float = DEFAULT_ALPHA,
                 threshold: float = DEFAULT_THRESHOLD) -> Comparison:
    """Each figure of each (label, configuration) that both sets have values of."""
    check_levels(alpha, threshold)
    changes = []
    for key in sorted(set(a.values) & set(b.values)):
        for name in figures():
            va, vb = a.values[key].get(name), b.values[key].get(name)
            if va and vb:
                changes.append(compare_values((*key, name), va, vb, alpha, threshold))
    return Comparison(a, b, alpha, threshold, changes, sorted(set(a.values) - set(b.values)),
                      sorted(set(b.values) - set(a.values)))


# ---------------------------------------------------------------- output

HEADERS = ("label", "configuration", "figure", "A median", "B median", "B/A (min–max)",
           "nA", "nB", "U", "p", "result")


def _median_cell(figure: str, stats: dict[str, Any]) -> str:
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
            f"{change.test.u:g}", f"{change.test.p:.3g}", change.verdict]


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
        lines.append("# no label and configuration with values on both sides")
    for side, keys in (("A", c.only_a), ("B", c.only_b)):
        if keys:
            lines.append(f"# only in {side}: " + ", ".join(f"{k[0]} {k[1]}" for k in keys))
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
            "ratio_max": plain(change.ratio_max), "u": change.test.u, "p": change.test.p,
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
                    ("per_run_plots", "--per-run-plots"), ("output", "--output"))
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
        target = getattr(args, "target_accuracy", None)
        sets = [load_set(spec, target) for spec in args.runs]
        comparison = compare_sets(*sets, alpha=args.alpha, threshold=args.threshold)
    except (CompareError, ValueError) as exc:
        err(str(exc))
        return 2
    print(format_comparison(comparison, args.format))
    return 1 if getattr(args, "fail_on_change", False) and comparison.changed else 0


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
