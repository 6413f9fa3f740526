"""``syncbench simulate --validate-pool SET.csv ...``: the validation over several sets.

A validation set (``jobs/validate_simulator.sh``: every strategy and configuration, each
run predicted from that set's own workload and calibration) gives each configuration two
or three repeats. On the emulated cluster two repeats of one configuration have differed
by up to 45% in samples/s, so a configuration off by more than 15% in one set may be the
set's noise, not the model's bias. ``--validate-csv FILE.csv`` keeps each run's row of a
``--validate`` (:func:`write_table`); this module pools the rows of several such files
(one file per set and model, all of one link rate: tables whose calibrated link rates
differ by more than :data:`LINK_RATIO` are refused) and prints, per model, label and
configuration:

- the error over every repeat of every set, the geometric mean of their pred/meas
  (:func:`~.validate.config_table`, as ``--validate`` takes a configuration's repeats);
- in how many sets the configuration was off on its own (each set's geometric mean), and
  whether those sets' errors share one sign: off in several sets with one sign is the
  model's bias; off in one set only, with the other sets within the limit, is that set's
  draw.

A row whose measured or predicted rate is not a positive number (a run that measured
nothing) has no error to pool: it is left out, and a line counts it.
"""

from __future__ import annotations

import argparse
import csv
import io
import math
from collections import Counter
from dataclasses import dataclass

from syncbench.bench.files import write_atomic

#: The table's columns, in order.
COLUMNS = ("run", "model", "label", "configuration", "measured_samples_per_s",
           "predicted_samples_per_s", "link_bytes_per_s")
#: Tables whose link rates (the calibrated bandwidth) differ by more than this factor are
#: of different links: 1 Gbit/s and 200 Mbit/s differ by 5, two calibrations of one link
#: by a few percent.
LINK_RATIO = 2.0


@dataclass(frozen=True)
class ValidationRow:
    """One validated run: its file, model, scenario label, configuration, both rates
    (samples/s) and its platform's link rate (bytes/s)."""

    run: str
    model: str
    label: str
    configuration: str
    measured: float
    predicted: float
    link: float

    @property
    def error(self) -> float:
        """pred/meas - 1 (NaN where nothing was measured)."""
        return self.predicted / self.measured - 1.0 if self.measured > 0 else math.nan


def write_table(path: str, rows: list[ValidationRow]) -> None:
    """``rows`` as CSV with :data:`COLUMNS`, written whole or not at all."""
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(COLUMNS)
    for r in rows:
        writer.writerow([r.run, r.model, r.label, r.configuration, f"{r.measured:.6g}",
                         f"{r.predicted:.6g}", f"{r.link:.6g}"])
    write_atomic(path, text.getvalue().encode())


def read_table(path: str) -> list[ValidationRow]:
    """The rows of a :func:`write_table` file, those without a positive rate included;
    ValueError naming the file and the fault."""
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            records = list(csv.reader(handle))
    except UnicodeDecodeError:
        raise ValueError(f"--validate-pool {path}: not a --validate-csv table (not UTF-8 "
                         "text)") from None
    except (OSError, csv.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"--validate-pool {path}: {reason}") from None
    if not records or tuple(records[0]) != COLUMNS:
        raise ValueError(f"--validate-pool {path}: not a --validate-csv table (its first line "
                         f"must be {','.join(COLUMNS)})")
    rows = []
    for number, record in enumerate(records[1:], start=2):
        try:
            if len(record) != len(COLUMNS):
                raise ValueError
            measured, predicted, link = (float(v) for v in record[4:7])
        except ValueError:
            raise ValueError(f"--validate-pool {path}: row {number} is not "
                             f"{len(COLUMNS)} fields ending in three numbers") from None
        rows.append(ValidationRow(*record[:4], measured, predicted, link))
    if not rows:
        raise ValueError(f"--validate-pool {path}: no runs in it")
    return rows


@dataclass(frozen=True)
class PooledConfig:
    """One model, label and configuration over the sets that ran it."""

    key: tuple[str, str, str]
    error: float
    repeats: int
    set_errors: tuple[float, ...]
    limit: float

    @property
    def sets_off(self) -> int:
        """Sets whose own error is off by more than the limit."""
        return sum(1 for e in self.set_errors if abs(e) > self.limit)

    @property
    def one_sign(self) -> bool:
        """Whether every set's error is non-zero with the pooled error's sign."""
        errors = (self.error, *self.set_errors)
        return all(e > 0 for e in errors) or all(e < 0 for e in errors)


def pool(sets: list[list[ValidationRow]], limit: float = 0.15) -> list[PooledConfig]:
    """Every (model, label, configuration) of ``sets``: its error over all repeats and
    each set's own (both the geometric mean of pred/meas, as ``--validate`` takes it)."""
    from syncbench.bench.simulate.validate import geometric_error

    keys: dict[tuple[str, str, str], list[list[float]]] = {}
    for rows in sets:
        mine: dict[tuple[str, str, str], list[float]] = {}
        for r in rows:
            mine.setdefault((r.model, r.label, r.configuration), []).append(r.error)
        for key, errs in mine.items():
            keys.setdefault(key, []).append(errs)
    return [PooledConfig(key, geometric_error([e for errs in per_set for e in errs]),
                         sum(len(errs) for errs in per_set),
                         tuple(geometric_error(errs) for errs in per_set), limit)
            for key, per_set in keys.items()]


def _rated(row: ValidationRow) -> bool:
    """Whether both of the row's rates are positive finite numbers (it has an error)."""
    return all(math.isfinite(v) and v > 0 for v in (row.measured, row.predicted))


def check_one_link(paths: list[str], tables: list[list[ValidationRow]]) -> None:
    """ValueError naming two tables whose link rates differ by more than
    :data:`LINK_RATIO` (a table's rate: its rows' median)."""
    rates = [sorted(r.link for r in rows)[len(rows) // 2] for rows in tables]
    low, high = min(range(len(rates)), key=rates.__getitem__), \
        max(range(len(rates)), key=rates.__getitem__)
    if not (rates[low] > 0 and rates[high] <= LINK_RATIO * rates[low]):
        raise ValueError(f"--validate-pool: {paths[low]} was predicted on a link of "
                         f"{rates[low] / 1e6:.3g} MB/s and {paths[high]} on one of "
                         f"{rates[high] / 1e6:.3g} MB/s: pool the tables of one link rate")


def pool_main(args: argparse.Namespace, limit: float = 0.15) -> int:
    """Body of ``--validate-pool``: the pooled table, then each set's verdict per
    configuration."""
    from syncbench.bench.simulate.validate import config_table

    paths = args.validate_pool
    if len(set(paths)) != len(paths):
        raise ValueError("--validate-pool names a file twice: its runs would count twice")
    tables = [read_table(path) for path in paths]
    check_one_link(paths, tables)
    sets = [[r for r in rows if _rated(r)] for rows in tables]
    left_out = sum(len(rows) for rows in tables) - sum(len(rows) for rows in sets)
    runs = [r.run for rows in sets for r in rows]
    twice = [run for run, count in Counter(runs).items() if count > 1]
    if twice:
        raise ValueError(f"--validate-pool: run {twice[0]} is in more than one table: "
                         "pool each set's tables once")
    cells = [(f"{r.model} {r.label}", r.configuration, r.error) for rows in sets for r in rows]
    print(f"{len(runs)} runs from {len(paths)} tables"
          + (f"; {left_out} row(s) without a positive measured and predicted rate left out"
             if left_out else ""))
    print(config_table(cells, limit))
    pooled = sorted(pool(sets, limit), key=lambda c: c.key)
    print()
    counts = Counter(c.sets_off for c in pooled)
    print(f"configurations by the number of their sets off by more than "
          f"{100 * limit:.0f}% on their own: "
          + ", ".join(f"{n} set(s): {counts[n]}" for n in sorted(counts)))
    shown = [c for c in pooled if c.sets_off or abs(c.error) > limit]
    if shown:
        print(f"{'model':<9}{'label':<24}{'configuration':<16}{'pooled':>8}{'repeats':>9}  "
              "each set (* off)")
    for c in shown:
        verdict = ("off in every set, one sign" if c.sets_off == len(c.set_errors) > 1
                   and c.one_sign else "")
        sets_text = " ".join(f"{100 * e:+.0f}%{'*' if abs(e) > limit else ''}"
                             for e in c.set_errors)
        print(f"{c.key[0][:8]:<9}{c.key[1][:23]:<24}{c.key[2][:15]:<16}"
              f"{100 * c.error:>+7.0f}%{c.repeats:>9}  {sets_text}  {verdict}".rstrip())
    return 0
