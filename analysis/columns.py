"""Every column of every table, defined once: the column registry.

A :class:`Column` says how a value is computed from a run (``compute``, on a
:class:`~syncbench.analysis.run_metrics.RunFacts`; cross-run columns start from
it and are filled by :mod:`.scaling`, :mod:`.hidden_comm` and the overlap
pass), how a group of repeats combines it (``merge``; default: the median,
with ``<key>_min`` / ``<key>_max`` when ``spread``), whether a diverged run is
left out, its Markdown format, the tables that show it (``tables``: table
name -> header) and its footnote (:mod:`.cells`). ``syncbench report`` (md,
csv, json), the runner's tables (:mod:`syncbench.bench.experiment.print_tables`)
and a sweep's scaling table print from it. The definitions of the figures are
in docs/USAGE.md.

The registry's order is the order of the keys of a report row (and of the CSV
and JSON columns): ``schema.REPORT_KEYS``, ``path``, then the later columns in
the order they were added, so old readers see the same prefix. The order of
the columns *within* a table is :data:`TABLE_ORDER`; a registered column that a
table's order does not list is shown at that order's ``*``.

Adding a metric to every table is one entry (in :func:`_registry`, or
:func:`register`) naming :data:`EVERY_TABLE`; a runner figure must be a number
(its repeats get a median (min–max)).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from . import cells, fairness, hidden_comm
from .data_record import data_record
from .numbers import NAN, finite, ratio, sum_finite
from .schema import (
    DATA_SHA256_ATTR,
    DATA_SOURCE_ATTR,
    FINAL_LOCAL_ACCURACY,
    PHASES,
    REPORT_KEYS,
)

if TYPE_CHECKING:
    from .run_metrics import RunFacts

PATH_KEY = "path"

#: Statistic of the realised slowdown factor in every table (per-step medians: robust to
#: the preemption noise of a shared machine, see fairness.realised_factors).
REALISED_STATISTIC = "median"

#: The tables a new metric shows up in: the report's first table, the runner's
#: comparison table (which records its per-run figure and its median over repeats)
#: and a sweep's scaling table.
EVERY_TABLE: tuple[str, ...] = ("runs", "runner", "sweep")

Row = dict[str, Any]


def _last_of(attr: str) -> Callable[[RunFacts], float]:
    """The last value of the per-evaluation root attribute ``attr``; NaN without one."""
    def last(f: RunFacts) -> float:
        values = f.run.attrs.get(attr)
        try:
            return float(values[-1]) if values is not None and len(values) else NAN
        except (TypeError, ValueError):
            return NAN
    return last


def _wire_bytes_per_sample(f: RunFacts) -> float:
    """``wire_bytes_per_step`` over the per-rank batch (samples per step row); for a
    strategy of rounds (Local SGD, SlowMo, DiLoCo and its streamed form, hierarchical,
    Oscars) one round's
    ``wire_bytes_per_outer_step`` over its ``outer_period_steps`` steps; NaN where the
    run declares no bytes (0: a strategy that does not count them)."""
    attrs = f.run.attrs
    declared = _float_or_nan(attrs.get("wire_bytes_per_step"))
    if not declared > 0:
        per_round = _float_or_nan(attrs.get("wire_bytes_per_outer_step"))
        period = _float_or_nan(attrs.get("outer_period_steps"))
        declared = per_round / period if per_round > 0 and period > 0 else NAN
    if not declared > 0 or not f.steps or not f.samples:
        return NAN
    return declared / (f.samples / f.steps)


# ---------------------------------------------------------------- group merges


def merge_labels(values: list[Any]) -> Any:
    """The common value; strings that differ joined with ``|``; else None."""
    unique: list[Any] = []
    for v in values:
        if v not in unique:
            unique.append(v)
    if len(unique) == 1:
        return unique[0]
    if all(isinstance(v, str) for v in unique):
        return "|".join(sorted(unique))
    return None


def _merge_count_flagged(values: list[Any]) -> int:
    return sum(bool(v) for v in values)


def _merge_signals(values: list[Any]) -> str:
    return ",".join(sorted({str(v) for v in values if v}))


def _merge_reached(values: list[Any]) -> int | None:
    return None if all(v is None for v in values) else sum(v or 0 for v in values)


def _merge_files(values: list[Any]) -> list[str]:
    return sorted({f for v in values for f in (v or ())}) or None  # type: ignore[return-value]


# ---------------------------------------------------------------- the entry


@dataclass(frozen=True)
class Shown:
    """How one table shows a column: its header, and where the table needs them, its
    own number format and (fixed-width tables) width."""

    header: str
    fmt: str | None = None
    width: int = 0


@dataclass(frozen=True)
class Column:
    """One column: how it is computed, combined over repeats, formatted and shown."""

    key: str
    #: The value of one run (None: a cell of the printed tables only, such as ``note``).
    compute: Callable[[RunFacts], Any] | None = None
    #: Markdown number format (``"{:.3f}"``); None: shown as it is, never right-aligned.
    fmt: str | None = None
    #: How a group row combines its runs' values; None: the median (NaN left out).
    merge: Callable[[list[Any]], Any] | None = None
    #: Group rows also get ``<key>_min`` / ``<key>_max``.
    spread: bool = False
    #: A diverged run is left out of the group's median (a diverged run's speed is no
    #: result); ``missing_is_slow``: a missing value counts as infinitely slow instead.
    diverged_excluded: bool = False
    missing_is_slow: bool = False
    #: A ratio to a baseline or reference run: NaN for a group with an incomplete run.
    baseline_ratio: bool = False
    #: Markdown shows "diverged" / "overlapped" instead of the value when every run was.
    flag_diverged: bool = False
    flag_overlapped: bool = False
    #: Table name -> header (or :class:`Shown`). Report tables: ``runs``, ``spread``,
    #: ``phase``, ``stragglers``, ``scaling``; the runner: ``runner`` (comparison table;
    #: the header may name ``{target}``), ``record`` (its results file's per-run
    #: figures), ``cell`` (the figures that get a median (min–max) over repeats);
    #: ``hetero``: its table of a heterogeneous configuration; ``sweep``: the scaling
    #: table of a sweep (medians per series and N).
    tables: Mapping[str, str | Shown] = field(default_factory=dict)
    #: A value computed from a report row (for a column that is no row value), and a
    #: group's value computed from its rows (default: the median of the values).
    of_row: Callable[[Row], Any] | None = None
    of_rows: Callable[[list[Row]], Any] | None = None
    #: A row value of the report (False: a figure of the runner only).
    report: bool = True
    #: Digits of the runner's ``median (min–max)``; the runner hides an ``optional``
    #: column when no cell has a value.
    digits: int = 2
    optional: bool = False
    #: The runner's per-run record of the value (e.g. ``float``); None: as it is.
    record: Callable[[Any], Any] | None = None
    #: A Markdown cell other than the formatted value (``cell(row)``).
    cell: Callable[[Row], str] | None = None
    #: Markdown alignment: None = right when every value is a number and ``fmt`` is set.
    left: bool = False
    #: Footnote lines under the report's Markdown for these rows (empty: none), and
    #: the line under a runner table that shows the column.
    footnote: Callable[[Sequence[Row]], list[str]] | None = None
    runner_footnote: str | None = None

    def figure(self, facts: RunFacts) -> Any:
        """The runner's per-run figure: the report row's value, or computed here."""
        value = facts.row[self.key] if self.report else self.compute(facts)  # type: ignore
        return self.record(value) if self.record is not None else value


def _summary(key: str) -> Callable[[RunFacts], float]:
    return lambda f: float(f.run.summary.get(key, NAN))


def _float_or_nan(value: Any) -> float:
    return float(NAN if value is None else value)


def _nan_if_none(value: Any) -> Any:
    return NAN if value is None else value


def tokens_per_s(model: Any, samples_per_s: float) -> float | None:
    """Tokens per second of a language model (``gpt``: each sample is a window of its
    context, ``ctx`` tokens); None for any other model (absent, not zero)."""
    from syncbench.kernels.gpt import parse_gpt_spec  # only for a run that names a model

    try:
        spec = parse_gpt_spec(str(model or ""))
    except ValueError:
        return None
    return None if spec is None else float(samples_per_s) * spec.ctx


def _int_or_none(value: Any) -> int | None:
    return int(value) if value is not None else None


# ---------------------------------------------------------------- the registry


def _registry() -> list[Column]:  # noqa: PLR0915 - one entry per column, in row order
    cols: list[Column] = []
    add = cols.append
    flags = {"flag_diverged": True, "flag_overlapped": True}
    # schema.REPORT_KEYS: the stored /summary and root attributes
    add(Column("algorithm", lambda f: f.label, merge=merge_labels))
    add(Column("world_size", lambda f: f.run.world_size, "{:d}", merge=merge_labels))
    add(Column("samples_per_s", _summary("samples_per_s"), "{:.1f}", spread=True,
               diverged_excluded=True, flag_diverged=True, digits=0, record=float,
               tables={"runs": "samples_per_s", "spread": "samples_per_s min - max",
                       "runner": "samples/s", "record": "", "cell": "",
                       "sweep": Shown("samples/s", "{:.1f}", 10)}))
    add(Column("wall_s", _summary("wall_s"), "{:.2f}", spread=True, record=float,
               tables={"runs": "wall_s", "spread": "wall_s min - max", "record": "",
                       "cell": ""}))
    add(Column("final_accuracy", _summary("final_accuracy"), "{:.4f}", spread=True, digits=3,
               record=float, optional=True, tables={"runs": "final_accuracy",
                                     "spread": "final_accuracy min - max",
                                     "runner": "accuracy", "record": "", "cell": ""}))
    add(Column("time_to_target_s", lambda f: f.time_to_target, "{:.2f}", spread=True,
               missing_is_slow=True, flag_diverged=True, footnote=cells.note_time_to_target,
               tables={"runs": "time_to_target_s", "spread": "time_to_target_s min - max",
                       "runner": "time to {target:g} [s]", "record": ""}))
    add(Column("comm_fraction", _summary("comm_fraction"), "{:.3f}", spread=True,
               tables={"runs": "comm_fraction"}))
    add(Column("wait_fraction", _summary("wait_fraction"), "{:.3f}", spread=True,
               tables={"runs": "wait_fraction"}))
    add(Column("stopped_by", lambda f: f.run.stopped_by, merge=_merge_signals,
               footnote=cells.note_stopped, record=lambda v: str(v or ""), tables={"record": ""}))
    add(Column("resumes", lambda f: f.run.resumes, "{:d}", record=lambda v: int(v or 0),
               merge=lambda vs: int(sum(int(v or 0) for v in vs)), tables={"record": ""}))
    add(Column(PATH_KEY, lambda f: f.run.path, merge=list))
    # the columns added since, in the order they were added
    add(Column("complete", lambda f: bool(f.run.complete), merge=all, record=bool,
               footnote=cells.note_incomplete, tables={"record": ""}))
    add(Column("repeats", lambda f: 1, "{:d}", merge=len, tables={"runs": "repeats"}))
    add(Column("model", lambda f: f.run.model, merge=merge_labels))
    add(Column("dataset", lambda f: f.run.dataset, merge=merge_labels))
    # where the data came from and its content hash (data_record.py): a group of repeats
    # over different data shows every value
    add(Column("data_source", lambda f: f.run.attrs.get(DATA_SOURCE_ATTR) or None,
               merge=merge_labels))
    add(Column("data_sha256", lambda f: f.run.attrs.get(DATA_SHA256_ATTR) or None,
               merge=merge_labels))
    add(Column("samples", lambda f: f.samples, "{:d}"))
    add(Column("steps", lambda f: f.steps, "{:d}"))
    add(Column("samples_per_s_per_rank",
               lambda f: ratio(f.row["samples_per_s"], f.run.world_size),
               diverged_excluded=True))
    add(Column("final_loss", _summary("final_loss"), "{:.4f}"))
    # a language model's throughput: samples are token windows of the model's context
    add(Column("tokens_per_s", lambda f: tokens_per_s(f.run.model, f.row["samples_per_s"]),
               "{:.0f}", spread=True, diverged_excluded=True, flag_diverged=True, digits=0,
               optional=True, record=_float_or_nan,
               tables={"runner": "tokens/s", "record": "", "cell": ""}))
    add(Column("best_accuracy", lambda f: f.best_accuracy, "{:.4f}",
               tables={"scaling": "best accuracy"}))
    add(Column("target_accuracy", lambda f: f.target, merge=merge_labels))
    add(Column("target_loss", lambda f: f.target_loss, merge=merge_labels))
    add(Column("target_reached", lambda f: None if f.goal is None
               else int(finite(f.row["time_to_target_s"])), merge=_merge_reached))
    add(Column("step_s_mean", lambda f: f.phases["step_s_mean"], "{:.5f}",
               tables={"phase": "step s"}))
    for p in PHASES:
        add(Column(f"{p}_s_per_step", lambda f, p=p: f.phases[f"{p}_s_per_step"], "{:.5f}",
                   cell=cells.phase_cell(p), left=True, tables={"phase": p}))
    for p in PHASES:
        if f"{p}_fraction" not in REPORT_KEYS:
            add(Column(f"{p}_fraction", lambda f, p=p: f.phases[f"{p}_fraction"], "{:.3f}"))
    add(Column("untracked_fraction", lambda f: f.phases["untracked_fraction"], "{:.3f}",
               cell=cells.percent_cell("untracked_fraction"), tables={"phase": "untracked"}))
    add(Column("rounds", lambda f: f.comm["rounds"], "{:.1f}"))
    add(Column("exposed_comm_s_per_round", lambda f: f.comm["exposed_comm_s_per_round"],
               "{:.5f}"))
    add(Column("hidden_comm_fraction", lambda f: NAN, "{:.3f}", spread=True,
               diverged_excluded=True, baseline_ratio=True, flag_diverged=True,
               optional=True, record=_float_or_nan,
               tables={"runs": "hidden_comm", "scaling": "hidden comm",
                       "runner": "hidden comm", "record": "", "cell": ""}))
    add(Column("step_s_median", lambda f: f.stragglers["step_s_median"], "{:.5f}", spread=True,
               tables={"stragglers": "step s median"}))
    add(Column("step_s_max", lambda f: f.stragglers["step_s_max"], "{:.5f}",
               tables={"stragglers": "step s max"}))
    add(Column("step_max_over_median", lambda f: f.stragglers["step_max_over_median"],
               "{:.2f}", spread=True, tables={"stragglers": "max/median"}))
    add(Column("busy_max_over_median", lambda f: f.stragglers["busy_max_over_median"],
               "{:.2f}", tables={"stragglers": "busy max/median of others"}))
    add(Column("slowest_rank", lambda f: f.stragglers["slowest_rank"], "{:d}",
               merge=merge_labels, tables={"stragglers": "slowest rank"}))
    add(Column("wait_share_max", lambda f: f.stragglers["wait_share_max"], "{:.3f}",
               tables={"stragglers": "wait share max"}))
    add(Column("idle_share_max", lambda f: f.stragglers["idle_share_max"], "{:.3f}",
               tables={"stragglers": "idle share max"}))
    # filled by scaling.add_scaling
    add(Column("scaling", lambda f: None, merge=merge_labels, tables={"scaling": "scaling"}))
    add(Column("baseline_world_size", lambda f: None, "{:d}", merge=merge_labels,
               tables={"scaling": "N0"}))
    add(Column("speedup", lambda f: NAN, "{:.2f}", spread=True, baseline_ratio=True, **flags,
               tables={"runs": "speedup", "spread": "speedup min - max",
                       "scaling": "speedup", "sweep": Shown("speedup", "{:.3f}", 10)}))
    add(Column("efficiency", lambda f: NAN, "{:.2f}", spread=True, baseline_ratio=True,
               **flags, tables={"runs": "efficiency", "spread": "efficiency min - max",
                                "scaling": "efficiency",
                                "sweep": Shown("efficiency", "{:.3f}", 10)}))
    add(Column("speedup_wall", lambda f: NAN, "{:.2f}", baseline_ratio=True, **flags,
               tables={"scaling": "speedup (wall)"}))
    add(Column("efficiency_wall", lambda f: NAN, "{:.2f}", baseline_ratio=True, **flags,
               tables={"scaling": "efficiency (wall)"}))
    # added later (after every older key, so old readers see the same prefix)
    sync_tables = {"runs": "sync", "spread": "sync_fraction min - max", "phase": "sync",
                   "stragglers": "sync", "scaling": "sync", "runner": "sync share",
                   "record": "", "cell": "", "sweep": Shown("sync", "{:.3f}", 5)}
    add(Column("sync_fraction", lambda f: sum_finite(f.row["comm_fraction"],
                                                     f.row["wait_fraction"]),
               "{:.3f}", spread=True, record=_float_or_nan, footnote=cells.note_sync,
               tables=sync_tables))
    add(Column("diverged", lambda f: f.diverged, merge=_merge_count_flagged,
               footnote=cells.note_diverged, tables={"record": ""}))
    add(Column("eval_interval_s", lambda f: f.eval_interval, "{:.2f}", record=_float_or_nan,
               tables={"runs": "eval every s", "runner": "eval every [s]", "record": "",
                       "cell": ""}))
    add(Column("warmup_steps", lambda f: fairness.warmup_steps(f.run), "{:d}",
               merge=merge_labels))
    add(Column("steady_step_s", lambda f: f.steady[0], "{:.5f}",
               tables={"scaling": "step s (steady)"}))
    add(Column("sync_s_per_step", lambda f: f.steady[1], "{:.5f}",
               tables={"scaling": "sync s/step"}))
    add(Column("overlapped", lambda f: False, merge=_merge_count_flagged,
               footnote=cells.note_overlapped, tables={"record": ""}))
    add(Column("overlaps_with", lambda f: None, merge=_merge_files))
    add(Column("series", lambda f: None, merge=merge_labels, tables={"scaling": "series"}))
    add(Column("mpi_library", lambda f: f.run.attrs.get("mpi_library"), merge=merge_labels))
    add(Column("backend", lambda f: f.run.attrs.get("backend"), merge=merge_labels))
    add(Column("scaling_mode", lambda f: f.scaling_mode, merge=merge_labels))
    add(Column("cores", lambda f: f.context["cores"], "{:d}", merge=merge_labels))
    add(Column("ranks_per_core", lambda f: f.context["ranks_per_core"], "{:.1f}",
               merge=merge_labels))
    add(Column("oversubscribed", lambda f: f.context["oversubscribed"], merge=merge_labels,
               footnote=cells.note_oversubscribed, tables={"record": ""}))
    add(Column("simulated", lambda f: f.context["simulated"], merge=merge_labels))
    add(Column("loaded", lambda f: f.context["loaded"], merge=_merge_count_flagged,
               footnote=cells.note_loaded, tables={"record": ""}))
    add(Column("foreign_cpu_share", lambda f: _nan_if_none(f.context["foreign_cpu_share"]),
               "{:.3f}", record=_float_or_nan, tables={"record": ""}))
    # --eval-model both: every rank's own weights on its test shard (/summary; NaN without)
    add(Column(FINAL_LOCAL_ACCURACY,
               lambda f: float(f.run.summary_extra.get(FINAL_LOCAL_ACCURACY, NAN))))
    # the bytes a rank hands to MPI per training sample (wire_bytes_per_step or a round's
    # bytes over its steps, over the per-rank batch); absent where nothing declares it
    add(Column("wire_bytes_per_sample", _wire_bytes_per_sample, "{:.0f}", digits=0,
               record=_float_or_nan, optional=True,
               tables={"runs": "wire B/sample", "runner": "wire B/sample", "record": "",
                       "cell": ""}))
    # the rest of the data's record (data_record.py), which the Markdown's "Data read"
    # tells in words: the files read (name, bytes, sha256 each) or the generator's
    # arguments; None where the run file records none (older files, simulations, the
    # other kind of data) and for a group of repeats that read different data
    add(Column("data_files", lambda f: data_record(f.run)["files"] or None,
               merge=merge_labels))
    add(Column("data_generator", lambda f: data_record(f.run)["generator"] or None,
               merge=merge_labels))
    # decentralized strategies (D-PSGD, AD-PSGD): at the last evaluation, the consensus
    # distance (1/N) sum_i ||x_i - x_bar||^2 and the ranks' own models' test accuracy
    add(Column("consensus_distance", _last_of("consensus_distance"), "{:.3g}", digits=5,
               record=_float_or_nan, optional=True,
               tables={"runs": "consensus", "runner": "consensus", "record": "", "cell": ""}))
    add(Column("replica_accuracy_mean", _last_of("replica_accuracy_mean"), "{:.4f}",
               record=_float_or_nan, tables={"runs": "own acc mean"}))
    add(Column("replica_accuracy_worst", _last_of("replica_accuracy_worst"), "{:.4f}", digits=3,
               record=_float_or_nan, optional=True, tables={"runs": "own acc worst",
                                             "runner": "worst own acc", "record": "",
                                             "cell": ""}))
    # cells of the printed tables only
    add(Column("note", report=False, cell=cells.note_cell,
               tables={"runs": "note", "scaling": "note"}))
    # figures of a sweep's scaling table only (medians per series and N)
    add(Column("batch_per_rank", report=False,
               of_row=lambda r: float(r["samples"]) / max(1, r["steps"]),
               tables={"sweep": Shown("batch/rank", "{:.0f}", 10)}))
    add(Column("steps_per_rank", report=False, of_row=lambda r: r["steps"] / r["world_size"],
               tables={"sweep": Shown("steps/rank", "{:.0f}", 10)}))
    add(Column("run_count", report=False, of_rows=len,
               tables={"sweep": Shown("runs", "{:d}", 4)}))
    # figures of the runner only (its results file and tables)
    add(Column("realised_factor", lambda f: fairness.realised_factor(f.run, REALISED_STATISTIC),
               report=False, tables={"record": "", "cell": "", "hetero": "realised (median)"},
               runner_footnote="realised factor: slowed rank's median per-step (compute + "
               "delay) / the median of the unslowed ranks' per-step compute"))
    add(Column("interference_ratio", lambda f: fairness.interference_ratio(f.run),
               report=False, digits=3, tables={"record": "", "cell": "", "hetero": "interference"},
               runner_footnote="interference: fast ranks' compute while a slowed rank is in its "
               "delay / their compute otherwise (1 = gives nothing away; - = never overlapped)"))
    add(Column("comm_compute_ratio", lambda f: hidden_comm.blocking_comm_compute_ratio(f.row),
               report=False,
               tables={"record": "", "cell": ""}))
    add(Column("buckets", lambda f: _int_or_none(f.run.attrs.get("buckets")), report=False,
               tables={"record": "", "cell": ""}))
    return cols


_COLUMNS: list[Column] = _registry()

#: The order of the columns within each table (``*``: where registered columns that the
#: order does not list go). ``footnotes``: the order of the report's footnotes.
TABLE_ORDER: dict[str, tuple[str, ...]] = {
    "runs": ("sync_fraction", "time_to_target_s", "eval_interval_s", "samples_per_s",
             "wall_s", "final_accuracy", "comm_fraction", "wait_fraction", "repeats",
             "speedup", "efficiency", "hidden_comm_fraction", "*", "note"),
    "spread": ("sync_fraction", "time_to_target_s", "samples_per_s", "wall_s",
               "final_accuracy", "speedup", "efficiency", "*"),
    "phase": ("sync_fraction", "step_s_mean", *(f"{p}_s_per_step" for p in PHASES),
              "untracked_fraction", "*"),
    "stragglers": ("sync_fraction", "*"),
    "scaling": ("sync_fraction", "series", "scaling", "baseline_world_size", "speedup",
                "efficiency", "speedup_wall", "efficiency_wall", "steady_step_s",
                "sync_s_per_step", "hidden_comm_fraction", "best_accuracy", "*", "note"),
    "runner": ("sync_fraction", "time_to_target_s", "eval_interval_s", "samples_per_s",
               "final_accuracy", "hidden_comm_fraction", "*"),
    "record": ("samples_per_s", "wall_s", "final_accuracy", "time_to_target_s", "diverged",
               "realised_factor", "interference_ratio", "hidden_comm_fraction",
               "comm_compute_ratio", "buckets", "oversubscribed", "overlapped",
               "sync_fraction", "eval_interval_s", "loaded", "foreign_cpu_share", "complete",
               "stopped_by", "resumes", "*"),
    "cell": ("samples_per_s", "final_accuracy", "wall_s", "realised_factor",
             "interference_ratio", "hidden_comm_fraction", "buckets", "sync_fraction",
             "eval_interval_s", "comm_compute_ratio", "*"),
    "sweep": ("sync_fraction", "batch_per_rank", "steps_per_rank", "run_count", "samples_per_s",
              "speedup", "efficiency", "*"),
    "footnotes": ("stopped_by", "complete", "diverged", "loaded", "overlapped",
                  "oversubscribed", "sync_fraction", "time_to_target_s", "*"),
}


def columns() -> tuple[Column, ...]:
    """Every registered column, in row order."""
    return tuple(_COLUMNS)


def column(key: str) -> Column | None:
    """The registered column ``key`` (None if there is none)."""
    return next((c for c in _COLUMNS if c.key == key), None)


def row_columns() -> tuple[Column, ...]:
    """The columns of a report row, in row order (``schema.REPORT_KEYS``, ``path`` first)."""
    return tuple(c for c in _COLUMNS if c.report)


def row_keys() -> tuple[str, ...]:
    """The keys of a report row, in order."""
    return tuple(c.key for c in row_columns())


def _placed(name: str, chosen: list[Column]) -> list[Column]:
    order = TABLE_ORDER.get(name, ("*",))
    rest = order.index("*") if "*" in order else len(order)
    return sorted(chosen, key=lambda c: order.index(c.key) if c.key in order else rest)


def table_columns(name: str) -> list[Column]:
    """The columns table ``name`` shows, in its order (:data:`TABLE_ORDER`)."""
    return _placed(name, [c for c in _COLUMNS if name in c.tables])


def table(name: str) -> list[tuple[Column, Shown]]:
    """(column, how it is shown) of table ``name``, in its order."""
    out = []
    for c in table_columns(name):
        shown = c.tables[name]
        out.append((c, shown if isinstance(shown, Shown) else Shown(shown)))
    return out


def runner_figures() -> list[Column]:
    """The runner's per-run figures (its results file's record), in order: the
    ``record`` table, then the ``runner`` table's columns it does not list."""
    listed = table_columns("record")
    return listed + [c for c in table_columns("runner") if c not in listed]


def runner_statistics() -> list[Column]:
    """The figures that get a median (min–max) over a label's repeats in the runner's
    cells: the ``cell`` table, then the ``runner`` table's other columns (not time to
    target, whose misses the runner counts as infinitely slow itself)."""
    listed = table_columns("cell")
    return listed + [c for c in table_columns("runner")
                     if c not in listed and not c.missing_is_slow]


def footnotes(rows: Sequence[Row]) -> list[str]:
    """The report's footnote lines for ``rows``, in :data:`TABLE_ORDER`'s order."""
    with_notes = _placed("footnotes", [c for c in _COLUMNS if c.footnote is not None])
    return [line for c in with_notes for line in c.footnote(rows)]  # type: ignore[misc]


@contextlib.contextmanager
def registered(entry: Column) -> Iterator[Column]:
    """Add ``entry`` to the registry for the ``with`` block (after every other column)."""
    if column(entry.key) is not None:
        raise ValueError(f"column {entry.key!r} is registered already")
    _COLUMNS.append(entry)
    try:
        yield entry
    finally:
        _COLUMNS.remove(entry)


def register(entry: Column) -> Column:
    """Add ``entry`` to the registry for good (after every other column)."""
    if column(entry.key) is not None:
        raise ValueError(f"column {entry.key!r} is registered already")
    _COLUMNS.append(entry)
    return entry


# ---------------------------------------------------------------- per-rank table

#: The report's per-rank table (``--per-rank``): (key of a rank row, header, format).
RANK_TABLE: tuple[tuple[str, str, str | None], ...] = (
    ("rank", "rank", "{:d}"), ("hostname", "host", None), ("slowdown", "slowdown", "{:g}"),
    ("slowdown_mode", "mode", None), ("slowdown_realised", "realised (median)", "{:.2f}"),
    ("steps", "steps", "{:d}"), ("busy_s_per_step", "busy s/step", "{:.5f}"),
    *((f"{p}_fraction", p, "{:.3f}") for p in PHASES),
    ("wait_share", "wait share", "{:.3f}"), ("idle_share", "idle share", "{:.3f}"),
    ("step_s_median", "step s median", "{:.5f}"), ("step_s_max", "step s max", "{:.5f}"),
)

# Formats of keys that are no column (``--by`` keys that are train flags), by suffix.
_SUFFIX_FORMATS: tuple[tuple[str, str], ...] = (
    ("_fraction", "{:.3f}"), ("_share", "{:.3f}"), ("_share_max", "{:.3f}"),
    ("_s_per_step", "{:.5f}"), ("_s_median", "{:.5f}"), ("_s_max", "{:.5f}"),
    ("_s_mean", "{:.5f}"), ("_s", "{:.3f}"), ("_per_s", "{:.1f}"),
)
_RANK_FORMATS = {key: spec for key, _, spec in RANK_TABLE}


def format_spec(key: str) -> str | None:
    """The Markdown number format of ``key``: a column's, ``<key>_min``/``_max`` of a
    spread column its column's, a per-rank key's, else by the key's suffix; else None."""
    base = key
    if key.endswith(("_min", "_max")):
        spread_column = column(key[:-4])
        if spread_column is not None and spread_column.spread:
            base = key[:-4]
    entry = column(base)
    if entry is not None and entry.report:
        return entry.fmt
    if base in _RANK_FORMATS:
        return _RANK_FORMATS[base]
    for suffix, spec in _SUFFIX_FORMATS:
        if base.endswith(suffix):
            return spec
    return None
