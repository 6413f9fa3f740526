"""Run files as one tidy table: a row per rank and step, or a row per evaluation.

A run file keeps its rows in h5py's datasets (one per column across ranks, or in
older files one HDF5 group per rank, ``/ranks/<r>/``), which pandas does not read
(``pandas.read_hdf`` reads PyTables' layout only). This module flattens them into
one long table, one observation per row
and one variable per column ("tidy data": H. Wickham, J. Stat. Softw. 59(10),
2014), which pandas, polars, R or a spreadsheet read directly:

* ``steps``: :data:`STEP_KEYS`, a row per rank and step: the run (file stem and
  path), its strategy and world size, the rank, its node (index into the sorted
  host names, ``schema.NODE_ATTRS``) and host name, then every column of
  ``schema.RANK_COLUMNS`` as stored.
* ``eval``: :data:`EVAL_KEYS`, a row per evaluation of ``/eval`` and
  ``/eval_local`` (``group`` says which).

``syncbench report --format steps|eval`` writes the table as CSV (stdout or
``-o FILE``; full precision, NaN as an empty field, as the report's CSV) or, for
``-o FILE.parquet``, as Parquet through pyarrow; ``Run.to_frame()`` returns it
as a pandas ``DataFrame``. CSV needs neither pandas nor pyarrow. Units and
descriptions of the columns are the run file's (``schema.DATASET_INFO``).
"""

from __future__ import annotations

import csv
import itertools
import os
import sys
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

import numpy as np

from .runfile import Run
from .schema import EVAL_COLUMNS, EVAL_GROUP, EVAL_LOCAL_GROUP, RANK_COLUMNS

#: Columns of the ``steps`` table, in order.
STEP_KEYS: tuple[str, ...] = ("run", "path", "algorithm", "world_size", "rank", "node",
                              "hostname", *RANK_COLUMNS)
#: Columns of the ``eval`` table, in order.
EVAL_KEYS: tuple[str, ...] = ("run", "path", "algorithm", "world_size", "group",
                              *EVAL_COLUMNS)
#: The tables, by name (``--format`` of ``syncbench report``, ``Run.to_frame``).
TABLES: dict[str, tuple[str, ...]] = {"steps": STEP_KEYS, "eval": EVAL_KEYS}

#: A block of rows: column -> an array (one value per row) or a scalar (every row's).
Block = dict[str, Any]


def _check_table(table: str) -> tuple[str, ...]:
    if table not in TABLES:
        raise ValueError(f"unknown table {table!r}; tables: {', '.join(TABLES)}")
    return TABLES[table]


def _run_keys(run: Run) -> Block:
    return {"run": os.path.splitext(os.path.basename(run.path))[0], "path": run.path,
            "algorithm": run.algorithm or "", "world_size": run.world_size}


def _nodes(run: Run) -> dict[int, int]:
    """rank -> its node: the rank attribute, else its host name's index in the sorted
    ``hostnames`` root attribute (or in the ranks' own host names), as the writer sets it."""
    names = run.attrs.get("hostnames")
    hosts = sorted({str(h) for h in names}) if isinstance(names, list) and names else \
        sorted({str(a.get("hostname", "")) for a in run.rank_attrs.values()})
    index = {h: i for i, h in enumerate(hosts)}
    nodes = {}
    for rank, attrs in run.rank_attrs.items():
        node = attrs.get("node")
        nodes[rank] = int(node) if node is not None else index.get(
            str(attrs.get("hostname", "")), -1)
    return nodes


def blocks(run: Run, table: str = "steps") -> Iterator[Block]:
    """The rows of ``run``'s ``table``, a block per rank (``steps``) or per group (``eval``)."""
    _check_table(table)
    head = _run_keys(run)
    if table == "eval":
        for group, cols in ((EVAL_GROUP, run.eval), (EVAL_LOCAL_GROUP, run.eval_local)):
            if cols is not None:
                yield {**head, "group": group, **cols}
        return
    nodes = _nodes(run)
    for rank in sorted(run.ranks):
        yield {**head, "rank": rank, "node": nodes.get(rank, -1),
               "hostname": str(run.rank_attrs.get(rank, {}).get("hostname", "")),
               **run.ranks[rank]}


def _rows(block: Block, keys: Sequence[str]) -> Iterator[tuple[Any, ...]]:
    """A block's rows as CSV values: NaN as an empty field, floats at full precision."""
    n = len(block["step"])
    columns = []
    for key in keys:
        value = block[key]
        if isinstance(value, np.ndarray):
            values = value.tolist()
            if value.dtype.kind == "f":
                values = ["" if v != v else v for v in values]  # NaN
            columns.append(values)
        else:
            columns.append(itertools.repeat(value, n))
    return zip(*columns)


def write_csv(runs: Sequence[Run], table: str, out: TextIO) -> int:
    """Write ``table`` of ``runs`` as CSV with a header row; returns the rows written."""
    keys = _check_table(table)
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(keys)
    count = 0
    for run in runs:
        for block in blocks(run, table):
            writer.writerows(_rows(block, keys))
            count += len(block["step"])
    return count


def columns(runs: Sequence[Run], table: str = "steps") -> dict[str, np.ndarray]:
    """``table`` of ``runs`` as whole columns (NumPy arrays, one entry per row)."""
    keys = _check_table(table)
    parts: dict[str, list[np.ndarray]] = {key: [] for key in keys}
    for run in runs:
        for block in blocks(run, table):
            n = len(block["step"])
            for key in keys:
                value = block[key]
                parts[key].append(value if isinstance(value, np.ndarray)
                                  else np.repeat(np.asarray([value]), n))
    dtypes = {**(EVAL_COLUMNS if table == "eval" else RANK_COLUMNS),
              "world_size": "i8", "rank": "i8", "node": "i8"}
    return {key: np.concatenate(parts[key]) if parts[key]
            else np.zeros(0, dtype=dtypes.get(key, "U1")) for key in keys}


def to_frame(runs: Sequence[Run], table: str = "steps") -> Any:
    """``table`` of ``runs`` as a pandas ``DataFrame`` (columns :data:`TABLES`' keys)."""
    try:
        import pandas as pd  # lazy: optional, only for DataFrames
    except ImportError:
        raise ImportError("to_frame needs pandas (pip install pandas); syncbench report "
                          "--format steps writes the same table as CSV without it") from None
    return pd.DataFrame(columns(runs, table))


def write_parquet(runs: Sequence[Run], table: str, path: str) -> int:
    """Write ``table`` of ``runs`` to ``path`` as Parquet; returns the rows written.

    ``ValueError`` (one line) when pyarrow is not installed."""
    try:
        import pyarrow as pa  # lazy: optional, only for Parquet
        import pyarrow.parquet as pq
    except ImportError:
        raise ValueError(f"{path}: writing Parquet needs pyarrow (pip install pyarrow); "
                         "without it, write CSV (-o FILE.csv, or stdout)") from None
    cols = columns(runs, table)
    pq.write_table(pa.table({key: pa.array(value) for key, value in cols.items()}), path)
    return len(next(iter(cols.values())))


def write_table(runs: Sequence[Run], table: str, output: str | None = None) -> int:
    """``table`` of ``runs`` as CSV on stdout (``output`` None), or to the file
    ``output``: Parquet when it ends in ``.parquet``, else CSV. Returns the rows
    written; ``ValueError`` or ``OSError`` when it cannot be written."""
    _check_table(table)
    if output is None:
        return write_csv(runs, table, sys.stdout)
    if output.lower().endswith(".parquet"):
        return write_parquet(runs, table, output)
    with open(output, "w", newline="") as out:
        return write_csv(runs, table, out)
