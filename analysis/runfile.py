"""Reading ``syncbench/1`` run files (HDF5) into plain Python and NumPy.

Only h5py and NumPy: no MPI, so run files can be read on a laptop. Every
problem with a file is a :class:`RunFileError` whose one-line message names
the file. An attribute that an older file stores as ``""`` (an unknown value:
``cupy_version``, ``slurm_job_id``, ``scaling_mode``, ...) is read as newer
files write it: absent, or NaN for a float (``schema.FLOAT_ATTRS``). :meth:`Run.to_frame` gives
the rows as one tidy pandas table (:mod:`syncbench.analysis.steps`).

Both rank layouts (``schema.RANK_LAYOUT_ATTR``) give the same :class:`Run`: the
packed one (one dataset per column across ranks, what the recorder writes) and
the groups one of older files (a group per rank). ``Run.ranks`` holds per-rank
columns either way (views into the packed columns for a packed file) and
:attr:`Run.packed` the rows of all ranks as one table (:mod:`.packed`), which
the tables reduce per rank without a Python loop over ranks.

A run file may come from anyone, so the reader takes nothing from outside it:
a dataset whose data lies in other files (external storage, a virtual
dataset), a link to another file (an external link, or a soft link whose path
passes through one) and a dataset larger than any run writes
(:data:`MAX_ELEMENTS`, :data:`MAX_EXPANSION`) are each refused with a
:class:`RunFileError` naming the dataset, before anything is read through
them. Links are checked without being followed, so no other file is opened.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

import h5py
import numpy as np
from h5py import h5a, h5d, h5g, h5l, h5s, h5t

from .packed import PackedRows
from .schema import (
    COMPLETE_ATTR,
    EVAL_COLUMNS,
    EVAL_GROUP,
    EVAL_LOCAL_GROUP,
    FLOAT_ATTRS,
    PHASES,
    RANK_ATTR_DTYPES,
    RANK_ATTR_UNKNOWN,
    RANK_ATTRS,
    RANK_COLUMN_DEFAULTS,
    RANK_COLUMNS,
    RANK_LAYOUT_ATTR,
    RANK_LAYOUT_GROUPS,
    RANK_LAYOUT_PACKED,
    RANK_LAYOUTS,
    RANKS_GROUP,
    RESUMES_ATTR,
    SCHEMA,
    STOPPED_BY_ATTR,
    SUMMARY_ATTRS,
    SUMMARY_GROUP,
    rank_group,
)

#: A rank group's name below ``/ranks``: the rank, five digits (see ``rank_group``).
_RANK_NAME = re.compile(r"^\d{5}$")
#: The recorder writes to a temporary name (``run.h5.tmp``, ``run.h5.tmp.<pid>``) then renames.
_TMP_NAME = re.compile(r"\.tmp(\.[^/\\]*)?$")


#: Elements of any one dataset at most: a column of every rank's steps holds ranks x
#: steps rows, and 2**31 (16,384 ranks of 131,072 steps each) is past any run.
MAX_ELEMENTS = 1 << 31
#: A dataset's data, read, may take at most this many times the bytes it takes in the file
#: (the recorder stores columns uncompressed: once), where it is over
#: :data:`_SMALL_BYTES`: a few bytes of file must not become gigabytes of memory (a huge
#: shape with no data written reads as fill values, compressed zeros likewise).
MAX_EXPANSION = 64
_SMALL_BYTES = 1 << 20
#: Soft links followed in one path at most.
_MAX_SOFT_LINKS = 16


class RunFileError(Exception):
    """A run file that is missing, unreadable, of another schema or incomplete.

    The message is one line and names the file.
    """

    def __init__(self, path: str | os.PathLike[str], problem: str) -> None:
        self.path = os.fspath(path)
        self.problem = " ".join(str(problem).split())  # one line
        super().__init__(f"{self.path} {self.problem}")


def _refusal(dsid: Any, file_size: int) -> str | None:
    """Why the dataset (a low-level ``DatasetID``) of a file of ``file_size`` bytes is not
    read, else None: its data lies in other files, or it is larger than a run writes or
    than the file could hold (module docstring)."""
    plist = dsid.get_create_plist()
    if plist.get_layout() == h5d.VIRTUAL:
        return "is a virtual dataset (its data lies in other files)"
    if plist.get_external_count():
        return "keeps its data in an external file"
    shape = dsid.shape or ()
    elements = math.prod(shape)
    if elements > MAX_ELEMENTS:
        return f"has shape {shape}: more than {MAX_ELEMENTS} elements, past any run"
    nbytes = elements * dsid.get_type().get_size()
    offset = dsid.get_offset()  # contiguous data written in this file, else None
    if offset is not None and offset + nbytes > file_size:
        return f"has shape {shape}: {nbytes} bytes, past the end of the file"
    if offset is None and nbytes > _SMALL_BYTES \
            and nbytes > MAX_EXPANSION * (stored := dsid.get_storage_size()):
        return (f"has shape {shape}: {nbytes} bytes from {stored} in the file, more than "
                f"{MAX_EXPANSION} times")
    return None


def check_dataset(path: str, obj: h5py.Dataset) -> h5py.Dataset:
    """``obj``, if it may be read (:func:`_refusal`, and in the file ``path``); else
    :class:`RunFileError` naming it."""
    problem = _refusal(obj.id, obj.file.id.get_filesize())
    if problem is None and not _same_file(obj, path):
        problem = "lies in another file"
    if problem is not None:
        raise RunFileError(path, f"is refused: {obj.name} {problem}")
    return obj


def _same_file(obj: h5py.HLObject, path: str) -> bool:
    try:
        return os.path.samefile(obj.file.filename, path)
    except OSError:
        return False


def get_checked(path: str, group: h5py.Group, name: str) -> h5py.HLObject | None:
    """``group[name]`` (``name`` a path, relative or absolute), None where it does not
    exist, reached through hard links and soft links only: a link to another file on the
    way is a :class:`RunFileError` naming it, found without following it; a dataset is
    :func:`check_dataset`-ed."""
    obj = _walk(path, group, name, 0)
    if isinstance(obj, h5py.Dataset):
        check_dataset(path, obj)
    return obj


def _walk(path: str, group: h5py.Group, name: str, depth: int) -> h5py.HLObject | None:
    current: h5py.HLObject = group.file["/"] if name.startswith("/") else group
    for part in (p for p in name.split("/") if p not in ("", ".")):
        if not isinstance(current, h5py.Group):
            return None
        link = current.get(part, getlink=True)
        where = f"{current.name.rstrip('/')}/{part}"
        if link is None:
            return None
        if isinstance(link, h5py.SoftLink):
            if depth >= _MAX_SOFT_LINKS:
                raise RunFileError(path, f"is refused: {where} is a soft link in a chain of "
                                   f"more than {_MAX_SOFT_LINKS}")
            current = _walk(path, current, link.path, depth + 1)
            if current is None:
                return None
        elif isinstance(link, h5py.HardLink):
            current = current[part]
        else:  # an external link, or a user-defined one: a way out of the file
            raise RunFileError(path, f"is refused: {where} is a link to another file")
    return current


def _has(path: str, group: h5py.Group, name: str) -> bool:
    """Whether ``group`` has ``name`` (:func:`get_checked`: no link is followed out)."""
    return get_checked(path, group, name) is not None


@dataclass
class Run:
    """One run file, read completely into memory."""

    path: str
    #: Root attributes; bytes decoded to ``str``, ``config`` parsed from JSON to a dict.
    attrs: dict[str, Any]
    #: rank -> every column of ``schema.RANK_COLUMNS`` (1-D, one row per step).
    ranks: dict[int, dict[str, np.ndarray]]
    #: rank -> its attributes (``hostname``, ``device``, ``slowdown``, ...: its rank
    #: group's attributes, or its entries of the packed per-rank datasets).
    rank_attrs: dict[int, dict[str, Any]]
    #: Every column of ``schema.EVAL_COLUMNS`` (1-D, one row per evaluation).
    eval: dict[str, np.ndarray]
    #: ``/summary`` attributes, the keys of ``schema.SUMMARY_ATTRS``.
    summary: dict[str, float]
    #: False on a run rebuilt from partial per-rank checkpoints.
    complete: bool = True
    #: Attributes of ``/summary`` beyond ``schema.SUMMARY_ATTRS``, if any.
    summary_extra: dict[str, Any] = field(default_factory=dict)
    #: ``/eval_local`` (``--eval-model both``): the columns of ``eval``; None without it.
    eval_local: dict[str, np.ndarray] | None = None
    #: How the file stored its ranks (``schema.RANK_LAYOUTS``): storage, not part of the
    #: run, so not compared; the root attribute is not in ``attrs`` either.
    rank_layout: str = field(default=RANK_LAYOUT_GROUPS, compare=False)
    #: :attr:`packed`, once built (the reader of a packed file gives it as stored).
    _packed: PackedRows | None = field(default=None, compare=False, repr=False)

    @property
    def packed(self) -> PackedRows:
        """Every rank's rows as one table (:class:`~.packed.PackedRows`: flat columns,
        ranks ascending, a row count per rank), built from :attr:`ranks` on first use
        and kept: the rows of a read run are not meant to change."""
        if self._packed is None:
            self._packed = PackedRows.from_ranks(self.ranks)
        return self._packed

    def to_frame(self, table: str = "steps") -> Any:
        """One tidy pandas ``DataFrame``: ``"steps"``, a row per rank and step (run,
        algorithm, world_size, rank, node, hostname and every rank column);
        ``"eval"``, a row per evaluation of ``/eval`` and ``/eval_local``. Needs
        pandas (``ImportError`` naming it otherwise); see :mod:`.steps`."""
        from .steps import to_frame  # lazy: steps imports this module

        return to_frame([self], table)

    @property
    def stopped_by(self) -> str:
        """The signal that stopped the run at a step boundary ("" if none, or an older file)."""
        return str(self.summary_extra.get(STOPPED_BY_ATTR, "") or "")

    @property
    def resumes(self) -> int:
        """How many times the run was continued with ``--resume`` (0 in older files)."""
        try:
            return int(self.attrs.get(RESUMES_ATTR, 0) or 0)
        except (TypeError, ValueError):
            return 0

    @property
    def world_size(self) -> int:
        """The ``world_size`` root attribute, else the number of ranks recorded."""
        value = self.attrs.get("world_size")
        return int(value) if value is not None else len(self.ranks)

    @property
    def algorithm(self) -> str | None:
        return self.attrs.get("algorithm")

    @property
    def model(self) -> str | None:
        return self.attrs.get("model")

    @property
    def dataset(self) -> str | None:
        return self.attrs.get("dataset")

    @property
    def config(self) -> dict[str, Any]:
        """Every command-line flag of the run (the parsed ``config`` root attribute)."""
        value = self.attrs.get("config")
        return value if isinstance(value, dict) else {}

    @property
    def steps(self) -> dict[int, int]:
        """rank -> number of step rows recorded for it."""
        return {r: len(cols["step"]) for r, cols in self.ranks.items()}


def _decode(value: Any) -> Any:
    """An HDF5 attribute value as plain Python (str, int, float, bool, list)."""
    if isinstance(value, bytes | np.bytes_):
        return bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return _decode(value[()])
        return [_decode(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list | tuple):
        return [_decode(v) for v in value]
    return value


def _known(attrs: dict[str, Any]) -> dict[str, Any]:
    """``attrs`` as newer files write an unknown value, which older files wrote ``""``:
    NaN for a float attribute (``schema.FLOAT_ATTRS``), else absent."""
    out = {}
    for key, value in attrs.items():
        if isinstance(value, str) and not value:
            if key not in FLOAT_ATTRS:
                continue
            value = math.nan
        out[key] = value
    return out


def _attrs(obj: h5py.HLObject) -> dict[str, Any]:
    return _known({str(k): _decode(v) for k, v in obj.attrs.items()})


def _columns(
    path: str, f: h5py.File, group: str, names: dict[str, str]
) -> dict[str, np.ndarray]:
    """Every dataset ``names`` of ``/group``: 1-D and all the same length."""
    parent = get_checked(path, f, group)
    if not isinstance(parent, h5py.Group):
        raise RunFileError(path, f"is incomplete: missing /{group}")
    cols: dict[str, np.ndarray] = {}
    for name in names:
        obj = get_checked(path, parent, name)
        if obj is None and name in RANK_COLUMN_DEFAULTS:  # a file older than the column
            cols[name] = None  # filled in below, once the row count is known
            continue
        if not isinstance(obj, h5py.Dataset):
            raise RunFileError(path, f"is incomplete: missing /{group}/{name}")
        data = np.asarray(obj[()])
        if data.ndim != 1:
            raise RunFileError(
                path, f"is malformed: /{group}/{name} has shape {data.shape}, expected 1-D"
            )
        cols[name] = data
    rows = max((len(c) for c in cols.values() if c is not None), default=0)
    for name, col in cols.items():
        if col is None:
            cols[name] = np.full(rows, RANK_COLUMN_DEFAULTS[name], dtype=names[name])
    lengths = {len(c) for c in cols.values()}
    if len(lengths) > 1:
        raise RunFileError(
            path, f"is malformed: the datasets of /{group} have different lengths {sorted(lengths)}"
        )
    return cols


class _Unusual(Exception):
    """Something :func:`_fast_group` does not read; the checked reader explains it."""


def _fast_attrs(oid: Any) -> dict[str, Any]:
    """Every attribute of an object, through h5py's low-level API (as ``_attrs``).

    The high-level ``AttributeManager`` costs ~80 us an attribute in Python
    bookkeeping; a file of 16,384 ranks has ~100,000 of them.
    """
    out: dict[str, Any] = {}
    for index in range(h5a.get_num_attrs(oid)):
        attr = h5a.open(oid, index=index)
        dtype = attr.dtype
        if attr.shape is None or dtype.subdtype is not None:
            raise _Unusual  # empty dataspace or array type: let h5py handle it
        arr = np.zeros(attr.shape, dtype=dtype)
        attr.read(arr, mtype=h5t.py_create(dtype))
        out[attr.name.decode("utf-8", errors="replace")] = _decode(arr)
    return _known(out)


def _fast_group(parent: Any, name: str, names: dict[str, str], file_size: int
                ) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """Columns and attributes of ``parent/name`` read with h5py's low-level API.

    Equal to :func:`_columns` and :func:`_attrs` for a well-formed group (the
    columns in the schema's dtypes, which the recorder writes), in a fraction
    of the time (no high-level object per dataset); None for
    anything unusual (missing or non-1-D datasets, unequal lengths), which
    the checked readers then report.
    """
    try:
        if not _hard_link(parent, name):
            return None
        gid = h5g.open(parent, name.encode())
        cols: dict[str, np.ndarray] = {}
        rows = -1
        for column, dtype in names.items():
            dsid = _fast_dataset(gid, column, np.dtype(dtype).itemsize, file_size)
            if dsid is _ABSENT and column in RANK_COLUMN_DEFAULTS:  # older than the column
                continue
            if dsid is None or dsid is _ABSENT:
                return None
            shape = dsid.shape
            if rows not in (-1, shape[0]):
                return None
            rows = shape[0]
            data = np.empty(shape, dtype=dtype)  # the schema's type (HDF5 converts if stored
            if rows:  # otherwise; asking the file for its type costs a third of the time)
                dsid.read(h5s.ALL, h5s.ALL, data)
            cols[column] = data
        for column in names:
            if column not in cols:
                cols[column] = np.full(max(rows, 0), RANK_COLUMN_DEFAULTS[column],
                                       dtype=names[column])
        return {c: cols[c] for c in names}, _fast_attrs(gid)
    except (_Unusual, KeyError, ValueError, TypeError, OSError, RuntimeError):
        return None


#: :func:`_fast_dataset`: no such link.
_ABSENT = object()


def _fast_dataset(gid: Any, name: str, itemsize: int, file_size: int) -> Any:
    """The dataset ``name`` of the group ``gid`` (low-level), if it is what the recorder
    writes: reached by a hard link, its data contiguous in this file (neither external
    nor virtual), ``itemsize``-byte elements fitting in the file's ``file_size`` bytes,
    at most :data:`MAX_ELEMENTS`. :data:`_ABSENT` if there is no such link; None for
    anything else, which the checked reader reads or refuses (:func:`check_dataset`)."""
    try:
        if gid.links.get_info(name.encode()).type != h5l.TYPE_HARD:
            return None
    except KeyError:
        return _ABSENT
    try:
        dsid = h5d.open(gid, name.encode())
    except KeyError:  # not a dataset
        return None
    shape = dsid.shape
    if shape is None or len(shape) != 1:
        return None
    if shape[0] == 0:  # nothing read, wherever it would lie
        return dsid
    offset = dsid.get_offset()  # None: not contiguous in this file
    if offset is None or shape[0] > MAX_ELEMENTS or offset + shape[0] * itemsize > file_size:
        return None
    return dsid


def _hard_link(gid: Any, name: str) -> bool:
    """Whether ``name`` of the group ``gid`` is a hard link (not soft, not external)."""
    try:
        return gid.links.get_info(name.encode()).type == h5l.TYPE_HARD
    except KeyError:
        return False


def _root_attrs(path: str, f: h5py.File) -> dict[str, Any]:
    """Root attributes, schema checked and ``config`` decoded from JSON."""
    attrs = _attrs(f)
    schema = attrs.get("schema")
    if schema is None:
        raise RunFileError(path, f"has no 'schema' attribute, expected '{SCHEMA}'")
    if schema != SCHEMA:
        raise RunFileError(path, f"has schema '{schema}', expected '{SCHEMA}'")
    config = attrs.get("config")
    if isinstance(config, str):
        try:
            attrs["config"] = json.loads(config) if config.strip() else {}
        except json.JSONDecodeError as exc:
            raise RunFileError(path, f"has a 'config' attribute that is not JSON ({exc})") from None
    return attrs


def _ranks(path: str, f: h5py.File, world_size: Any, complete: bool
           ) -> tuple[dict[int, dict[str, np.ndarray]], dict[int, dict[str, Any]]]:
    """Every rank group's columns and attributes (all ranks unless the run is partial)."""
    ranks_group = get_checked(path, f, RANKS_GROUP)
    if not isinstance(ranks_group, h5py.Group):
        raise RunFileError(path, f"is incomplete: missing /{RANKS_GROUP}")
    rank_names = sorted(ranks_group)
    for name in rank_names:
        if not _RANK_NAME.match(name):
            raise RunFileError(
                path, f"is malformed: /{RANKS_GROUP}/{name} is not a five-digit rank"
            )
    ranks: dict[int, dict[str, np.ndarray]] = {}
    rank_attrs: dict[int, dict[str, Any]] = {}
    parent = ranks_group.id
    file_size = f.id.get_filesize()
    for name in rank_names:
        rank = int(name)
        fast = _fast_group(parent, name, RANK_COLUMNS, file_size)
        if fast is not None:
            ranks[rank], rank_attrs[rank] = fast
            continue
        group = rank_group(rank)
        ranks[rank] = _columns(path, f, group, RANK_COLUMNS)
        rank_attrs[rank] = _attrs(get_checked(path, f, group))
    if complete and world_size is not None:
        for rank in range(int(world_size)):
            if rank not in ranks:
                raise RunFileError(path, f"is incomplete: missing /{rank_group(rank)}")
    return ranks, rank_attrs


def _packed_dataset(path: str, group: h5py.Group, name: str, dtype: Any,
                    length: int | None) -> np.ndarray:
    """A 1-D dataset of a packed ``group`` read as ``dtype``, ``length`` long if given."""
    obj = get_checked(path, group, name)
    if not isinstance(obj, h5py.Dataset):
        raise RunFileError(path, f"is incomplete: missing {group.name}/{name}")
    if obj.ndim != 1 or (length is not None and obj.shape[0] != length):
        expected = "1-D" if length is None else f"({length},)"
        raise RunFileError(path, f"is malformed: {group.name}/{name} has shape {obj.shape}, "
                           f"expected {expected}")
    if dtype == "str":
        return np.asarray(obj.asstr()[()], dtype=object) if obj.dtype.kind == "O" \
            else np.char.decode(obj[()].astype(bytes), "utf-8", errors="replace")
    data = np.empty(obj.shape, dtype=dtype)
    if obj.shape[0]:
        obj.read_direct(data)
    return data


def packed_index(path: str, group: h5py.Group) -> tuple[np.ndarray, np.ndarray]:
    """(ranks, rows per rank) of a packed group (``/ranks``, ``/ranks/events``), checked:
    the same length, ranks ascending and distinct, no negative count."""
    ranks = _packed_dataset(path, group, "rank", np.int64, None)
    counts = _packed_dataset(path, group, "rows", np.int64, len(ranks))
    if ranks.size and (ranks.min() < 0 or np.any(np.diff(ranks) <= 0)):
        raise RunFileError(path, f"is malformed: {group.name}/rank is not ascending distinct "
                           "ranks >= 0")
    if np.any(counts < 0):
        raise RunFileError(path, f"is malformed: {group.name}/rows has a negative count")
    return ranks, counts


def packed_columns(path: str, group: h5py.Group, names: dict[str, str], rows: int,
                   defaults: dict[str, float] | None = None) -> dict[str, np.ndarray]:
    """Every column ``names`` (name -> dtype) of a packed group, ``rows`` long; a column
    missing from the file with a ``defaults`` value (a column newer than the file) is
    filled with it."""
    cols = {}
    for name, dtype in names.items():
        if defaults and name in defaults and not _has(path, group, name):
            cols[name] = np.full(rows, defaults[name], dtype=dtype)
        else:
            cols[name] = _packed_dataset(path, group, name, dtype, rows)
    return cols


def _packed_rank_attrs(path: str, group: h5py.Group, n: int) -> list[dict[str, Any]]:
    """Each rank's attributes from the per-rank datasets (``schema.RANK_ATTR_DTYPES``), as
    the groups layout reads them: an unknown string or integer absent, a float NaN."""
    out: list[dict[str, Any]] = [{} for _ in range(n)]
    for name in sorted(RANK_ATTRS):  # the groups layout's order (HDF5's, by name)
        if not _has(path, group, name):
            continue
        kind = RANK_ATTR_DTYPES.get(name, "f8")
        values = _packed_dataset(path, group, name,
                                 {"str": "str", "i8": np.int64}.get(kind, np.float64), n)
        unknown = RANK_ATTR_UNKNOWN.get(kind)
        for attrs, value in zip(out, values.tolist()):
            if value != unknown:
                attrs[name] = value
    return out


def _ranks_packed(path: str, f: h5py.File, world_size: Any, complete: bool
                  ) -> tuple[dict[int, dict[str, np.ndarray]], dict[int, dict[str, Any]],
                             PackedRows]:
    """The packed layout's ranks: per-rank columns (views into the packed ones), per-rank
    attributes, and the table itself."""
    group = get_checked(path, f, RANKS_GROUP)
    if not isinstance(group, h5py.Group):
        raise RunFileError(path, f"is incomplete: missing /{RANKS_GROUP}")
    ranks, counts = packed_index(path, group)
    cols = packed_columns(path, group, RANK_COLUMNS, int(counts.sum()), RANK_COLUMN_DEFAULTS)
    table = PackedRows(ranks, counts, cols)
    ends = np.cumsum(counts).tolist()
    starts = [0, *ends[:-1]]
    by_rank: dict[int, dict[str, np.ndarray]] = {}
    for rank, start, end in zip(ranks.tolist(), starts, ends):
        by_rank[rank] = {name: col[start:end] for name, col in cols.items()}
    attrs = dict(zip(ranks.tolist(), _packed_rank_attrs(path, group, len(ranks))))
    if complete and world_size is not None:
        missing = sorted(set(range(int(world_size))) - set(by_rank))
        if missing:
            raise RunFileError(path, f"is incomplete: rank {missing[0]} missing from "
                               f"/{RANKS_GROUP}/rank")
    return by_rank, attrs, table


def _summary(path: str, f: h5py.File) -> tuple[dict[str, float], dict[str, Any]]:
    """The ``SUMMARY_ATTRS`` as floats, and the group's other attributes."""
    group = get_checked(path, f, SUMMARY_GROUP)
    if group is None:
        raise RunFileError(path, f"is incomplete: missing /{SUMMARY_GROUP}")
    summary_attrs = _attrs(group)
    summary: dict[str, float] = {}
    for key in SUMMARY_ATTRS:
        if key not in summary_attrs:
            raise RunFileError(
                path, f"is incomplete: missing attribute '{key}' of /{SUMMARY_GROUP}"
            )
        try:
            summary[key] = float(summary_attrs.pop(key))
        except (TypeError, ValueError):
            raise RunFileError(
                path, f"is malformed: attribute '{key}' of /{SUMMARY_GROUP} is not a number"
            ) from None
    return summary, summary_attrs


#: Seconds past any run: a time (or duration) beyond this is not a measurement (31 years).
MAX_SECONDS = 1e9
#: A count (step, samples) past any run.
MAX_COUNT = 1 << 53


@dataclass(frozen=True)
class Bounds:
    """What a value of a column may be: within ``lo`` .. ``hi``, NaN (and infinities)
    only where ``nan_ok`` (a diverged loss, an evaluation's accuracy)."""

    lo: float
    hi: float
    nan_ok: bool = False


_TIME = Bounds(0.0, MAX_SECONDS)
_COUNT = Bounds(0, MAX_COUNT)
#: Physical bounds of the rank columns, the evaluation columns and ``/summary``'s
#: figures (a column not named is not checked: its values have no bound of their own).
#: ``t_start`` and an evaluation's ``t`` are instants, which may be a little negative
#: (another rank's clock mapped onto rank 0's: ASGD's evaluations on its dedicated host
#: measured -0.7 ms); a loss is a cross-entropy (>= 0 up to rounding), NaN or infinite
#: when training diverged.
RANK_BOUNDS: dict[str, Bounds] = {
    "step": _COUNT, "t_start": Bounds(-MAX_SECONDS, MAX_SECONDS),
    **{f"t_{p}": _TIME for p in PHASES},
    "loss": Bounds(-1e-6, math.inf, nan_ok=True), "samples": _COUNT,
    "staleness_min": _COUNT, "local_steps": _COUNT, "round": _COUNT,
}
EVAL_BOUNDS: dict[str, Bounds] = {
    "t": Bounds(-MAX_SECONDS, MAX_SECONDS), "step": _COUNT, "samples_seen": _COUNT,
    "loss": Bounds(-1e-6, math.inf, nan_ok=True), "accuracy": Bounds(0.0, 1.0, nan_ok=True),
}
SUMMARY_BOUNDS: dict[str, Bounds] = {
    "wall_s": Bounds(0.0, MAX_SECONDS, nan_ok=True),
    "samples_per_s": Bounds(0.0, math.inf, nan_ok=True),
    "final_accuracy": Bounds(0.0, 1.0, nan_ok=True),
    "time_to_target_s": Bounds(0.0, MAX_SECONDS, nan_ok=True),
    "comm_fraction": Bounds(0.0, 10.0, nan_ok=True),
    "wait_fraction": Bounds(0.0, 10.0, nan_ok=True),
}


def _out_of_bounds(values: np.ndarray, bounds: Bounds) -> int | None:
    """The index of the first value of ``values`` outside ``bounds``, else None."""
    data = np.asarray(values)
    if data.size == 0:
        return None
    if data.dtype.kind in "iub":
        bad = (data < bounds.lo) | (data > bounds.hi)
    else:
        data = data.astype(np.float64, copy=False)
        with np.errstate(invalid="ignore"):
            nan = np.isnan(data)
            bad = ~nan & ((data < bounds.lo) | (data > bounds.hi))
            if not bounds.nan_ok:
                bad |= nan | np.isinf(data)
    hit = np.flatnonzero(bad)
    return int(hit[0]) if hit.size else None


def _check_column(path: str, where: str, values: np.ndarray, bounds: Bounds) -> None:
    index = _out_of_bounds(values, bounds)
    if index is not None:
        value = np.asarray(values)[index].item()
        raise RunFileError(path, f"is corrupt: {where} has {value!r:.40} at row {index}, "
                           f"outside {bounds.lo:g} .. {bounds.hi:g}"
                           f"{'' if bounds.nan_ok else ' (and no NaN)'}")


def check_values(path: str, run: Run) -> None:
    """:class:`RunFileError` naming the file and the dataset when a value of the rows
    (every rank's, ``/eval``, ``/eval_local``) or of ``/summary`` is outside its
    physical bounds (:data:`RANK_BOUNDS`, :data:`EVAL_BOUNDS`, :data:`SUMMARY_BOUNDS`):
    bytes overwritten in a file read as numbers, and a report of them would print them
    as figures. A packed file's columns are checked as stored, once for every rank."""
    if run.rank_layout == RANK_LAYOUT_PACKED and run._packed is not None:
        for name, bounds in RANK_BOUNDS.items():
            _check_column(path, f"/{RANKS_GROUP}/{name}", run._packed.columns[name], bounds)
    else:
        for rank, cols in run.ranks.items():
            for name, bounds in RANK_BOUNDS.items():
                _check_column(path, f"/{rank_group(rank)}/{name}", cols[name], bounds)
    for group, cols in ((EVAL_GROUP, run.eval), (EVAL_LOCAL_GROUP, run.eval_local)):
        for name, bounds in EVAL_BOUNDS.items() if cols is not None else ():
            _check_column(path, f"/{group}/{name}", cols[name], bounds)
    for name, bounds in SUMMARY_BOUNDS.items():
        index = _out_of_bounds(np.array([run.summary[name]]), bounds)
        if index is not None:
            raise RunFileError(path, f"is corrupt: attribute '{name}' of /{SUMMARY_GROUP} is "
                               f"{run.summary[name]!r:.40}, outside {bounds.lo:g} .. "
                               f"{bounds.hi:g}")


def _read(path: str, f: h5py.File) -> Run:
    attrs = _root_attrs(path, f)
    layout = attrs.pop(RANK_LAYOUT_ATTR, RANK_LAYOUT_GROUPS)
    if layout not in RANK_LAYOUTS:
        raise RunFileError(path, f"has rank_layout '{layout}', expected one of "
                           f"{', '.join(RANK_LAYOUTS)}")
    summary, summary_extra = _summary(path, f)
    # /summary's flag (this round's files), else the root attribute (older files)
    complete = bool(summary_extra.get(COMPLETE_ATTR, attrs.get(COMPLETE_ATTR, True)))
    packed = None
    if layout == RANK_LAYOUT_PACKED:
        ranks, rank_attrs, packed = _ranks_packed(path, f, attrs.get("world_size"), complete)
    else:
        ranks, rank_attrs = _ranks(path, f, attrs.get("world_size"), complete)
    eval_cols = _columns(path, f, EVAL_GROUP, EVAL_COLUMNS)
    eval_local = (_columns(path, f, EVAL_LOCAL_GROUP, EVAL_COLUMNS)
                  if _has(path, f, EVAL_LOCAL_GROUP) else None)
    run = Run(
        path=path,
        attrs=attrs,
        ranks=ranks,
        rank_attrs=rank_attrs,
        eval=eval_cols,
        summary=summary,
        complete=complete,
        summary_extra=summary_extra,
        eval_local=eval_local,
        rank_layout=layout,
        _packed=packed,
    )
    check_values(path, run)
    return run


def read_run(path: str | os.PathLike[str]) -> Run:
    """Read one run file completely; raise :class:`RunFileError` on any problem."""
    path = os.fspath(path)
    tmp_hint = (
        " (a temporary file: the run may still be writing it or may have crashed)"
        if _TMP_NAME.search(path)
        else ""
    )
    if not os.path.exists(path):
        raise RunFileError(path, "does not exist")
    if os.path.isdir(path):
        raise RunFileError(path, "is a directory, not a run file")
    try:
        is_hdf5 = h5py.is_hdf5(path)
    except OSError as exc:
        raise RunFileError(path, f"cannot be read: {exc}") from None
    if not is_hdf5:
        raise RunFileError(path, f"is not an HDF5 file{tmp_hint}")
    try:
        with h5py.File(path, "r") as f:
            return _read(path, f)
    except RunFileError as exc:
        if tmp_hint and tmp_hint not in exc.problem:
            raise RunFileError(path, exc.problem + tmp_hint) from None
        raise
    except (OSError, KeyError, ValueError, RuntimeError, TypeError) as exc:
        # Truncated or partly written files fail inside HDF5 in various ways.
        problem = f"cannot be read (truncated or partly written?): {exc}{tmp_hint}"
        raise RunFileError(path, problem) from None
