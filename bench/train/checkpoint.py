"""Crash safety: per-rank row files, resumable state, the run file's lock, write errors.

What a run keeps beside its run file, and how ``syncbench recover`` rebuilds a partial
run file from it, is that command's description
(:mod:`syncbench.bench.commands.recover`); :func:`recover` is its work.
"""

from __future__ import annotations

import errno
import io
import json
import os
import shutil
import struct
import sys
import time
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import h5py
import numpy as np

from syncbench.analysis import schema
from syncbench.bench.files import ExclusiveLock, LockHeld, WriteError, write_atomic
from syncbench.bench.mpi.errors import exit_after_grace

if TYPE_CHECKING:
    from syncbench.bench.train.config import TrainConfig

T = TypeVar("T")


def parts_dir(out: str | os.PathLike) -> Path:
    """The side folder of run file ``out``."""
    out = Path(out)
    return out.with_name(out.name + ".parts")


def lock_path(out: str | os.PathLike) -> Path:
    """The lock file of run file ``out`` (beside it: the parts folder is removed)."""
    out = Path(out)
    return out.with_name(out.name + ".lock")


def run_lock(out: str | os.PathLike) -> ExclusiveLock:
    """The lock on run file ``out`` (module docstring); not yet taken."""
    return ExclusiveLock(lock_path(out), f"run file {out}")


#: ``flock`` errors of a file system that has no locks (Lustre mounted ``noflock``, some
#: NFS set-ups): a run there goes on unlocked, with a warning.
NO_LOCKS = frozenset({errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP})


def take_lock(lock: ExclusiveLock, prog: str) -> str:
    """Take ``lock`` at once; "" when it is held now, else the one-line reason (another
    process holds it: :class:`LockHeld`'s line naming it; or the lock file cannot be
    made). Where the file system has no locks (:data:`NO_LOCKS`) it prints one warning
    line (``prog: warning: ...``) and returns "": the run goes on unlocked."""
    try:
        lock.acquire()
    except LockHeld as exc:
        return str(exc)
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno in NO_LOCKS:
            with _quiet():
                lock.path.unlink()
            print(f"{prog}: warning: cannot lock {lock.path} ({reason}): this file system "
                  f"has no locks, so nothing stops another process using {lock.what}",
                  file=sys.stderr, flush=True)
            return ""
        return f"cannot lock {lock.path}: {reason}"
    return ""


def hdf5_image(build: Callable[[h5py.File], None]) -> bytes:
    """The bytes of an HDF5 file that ``build`` fills, made in memory (no disk I/O)."""
    with h5py.File(f"in-memory-{id(build)}.h5", "w", driver="core", backing_store=False) as f:
        build(f)
        f.flush()
        return f.id.get_file_image()


class _quiet:
    """``with _quiet():`` ignores an ``OSError`` (clean-up after a failed write)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: object) -> bool:
        return kind is not None and issubclass(kind, OSError)


def abort_on_write_error(comm: Any, error: WriteError) -> None:
    """End the job from a rank whose write failed mid-run: one line, then ``MPI_Abort``."""
    from syncbench.bench.mpi.runtime import ABORT_GRACE_S  # lazy: mpi4py.MPI starts MPI

    sys.stdout.flush()
    print(f"syncbench: rank {comm.Get_rank()}: {error}; aborting the job", file=sys.stderr,
          flush=True)
    time.sleep(ABORT_GRACE_S)  # let the launcher forward the line before the kill
    comm.Abort(1)


def agree_on_write(comm: Any, write: Callable[[], T] | None, command: str = "train",
                   note: str = "") -> T | None:
    """Rank 0 runs ``write`` (the other ranks pass None); every rank learns the outcome.

    On a :class:`WriteError`, rank 0 prints ``syncbench COMMAND: error: cannot write
    PATH: CAUSE (errno N)`` and ``note``, and every rank exits with status 2 (the
    others :func:`~syncbench.bench.mpi.errors.exit_after_grace` later). The other ranks
    wait by polling, leaving rank 0 its core.
    """
    from syncbench.bench.mpi.runtime import wait_politely  # lazy: mpi4py.MPI starts MPI

    result: T | None = None
    failed = np.zeros(1, dtype=np.int64)
    error: WriteError | None = None
    if write is not None:
        try:
            result = write()
        except WriteError as exc:
            error, failed[0] = exc, 1
    wait_politely(comm.Ibcast(failed, root=0))
    if not failed[0]:
        return result
    sys.stdout.flush()
    if error is None:
        exit_after_grace()
    print(f"syncbench {command}: error: {error}{note}", file=sys.stderr, flush=True)
    raise SystemExit(2)


def _make_folder(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise WriteError(folder, exc) from None


def write_meta(folder: Path, root_attrs: Mapping[str, Any], target: float | None,
               target_loss: float | None = None) -> None:
    """Root attributes of the run and its target (rank 0, once at the start)."""
    _make_folder(folder)
    text = json.dumps({"root": dict(root_attrs), "target_accuracy": target,
                       "target_loss": target_loss}, default=str)
    write_atomic(folder / "meta.json", text.encode())


# -- rows --------------------------------------------------------------------
ROWS_MAGIC = b"SYNCBENCH-ROWS 1\n"
#: Chunk header: b"ROWS", first row index, row count, CRC32 of the records.
_CHUNK = struct.Struct("<4sQQI")
_CHUNK_TAG = b"ROWS"


def _rows_dtype(columns: Mapping[str, Any]) -> np.dtype:
    return np.dtype([(name, np.dtype(dt).newbyteorder("<")) for name, dt in columns.items()])


def _rows_path(folder: Path, rank: int) -> Path:
    return folder / f"rows-{rank:05d}.bin"


class RowsFile:
    """Rank ``rank``'s append-only rows file, ``rows-RRRRR.bin`` (see the module docstring).

    The file is a header line (``SYNCBENCH-ROWS 1`` and the columns' names and
    dtypes as JSON), then one chunk per flush with a CRC. :meth:`flush` writes
    the rows added since the previous flush and the last flushed row again
    (:meth:`StepRecorder.add_to_last` may have changed it); the first flush of
    the process writes the file afresh (a resumed run's rows come from its
    checkpoint). A reader keeps the newest copy of each row and stops at a torn
    or corrupt trailing chunk (:func:`read_rows_file`), so a flush costs its new
    rows, not the whole run. The rank's attributes and the evaluation rows are
    side files, rewritten atomically only when they changed.
    """

    def __init__(self, folder: Path, rank: int) -> None:
        self.folder, self.rank = folder, rank
        self.path = _rows_path(folder, rank)
        self.dtype = _rows_dtype(schema.RANK_COLUMNS)
        #: Rows in the file, and its length in bytes (None: not written by this process).
        self.rows = 0
        self.size: int | None = None
        self._attrs = ""
        self._evals = -1

    def flush(self, rows: Mapping[str, np.ndarray], rank_attrs: Mapping[str, Any],
              evals: Mapping[str, np.ndarray] | None) -> None:
        """Bring the files up to ``rows`` (all of the rank's rows; views are fine)."""
        count = len(rows["step"])
        if self.size is None:
            _make_folder(self.folder)
            self._write_afresh(rows, count)
        elif count:
            self._append(rows, min(max(self.rows - 1, 0), count - 1), count)
        attrs = json.dumps(dict(rank_attrs), default=str, sort_keys=True)
        if attrs != self._attrs:
            write_atomic(self.folder / f"attrs-{self.rank:05d}.json", attrs.encode())
            self._attrs = attrs
        if evals is not None and len(evals["t"]) != self._evals:
            buffer = io.BytesIO()
            np.savez(buffer, **evals)
            write_atomic(self.folder / "evals.npz", buffer.getvalue())
            self._evals = len(evals["t"])

    def _chunk(self, rows: Mapping[str, np.ndarray], start: int, stop: int) -> bytes:
        records = np.empty(stop - start, dtype=self.dtype)
        for name in self.dtype.names:
            records[name] = rows[name][start:stop]
        payload = records.tobytes()
        return _CHUNK.pack(_CHUNK_TAG, start, stop - start, zlib.crc32(payload)) + payload

    def _write_afresh(self, rows: Mapping[str, np.ndarray], count: int) -> None:
        header = json.dumps({"rank": self.rank, "columns": [
            [name, self.dtype[name].str] for name in self.dtype.names]}).encode()
        data = ROWS_MAGIC + header + b"\n" + (self._chunk(rows, 0, count) if count else b"")
        write_atomic(self.path, data)
        self.rows, self.size = count, len(data)

    def _append(self, rows: Mapping[str, np.ndarray], start: int, count: int) -> None:
        data = self._chunk(rows, start, count)
        try:
            fd = os.open(self.path, os.O_WRONLY)
            try:
                try:
                    os.lseek(fd, self.size, os.SEEK_SET)
                    view = memoryview(data)
                    while view:
                        view = view[os.write(fd, view):]
                except OSError:
                    with _quiet():  # cut back to the last whole chunk (frees the space too)
                        os.ftruncate(fd, self.size)
                    raise
            finally:
                os.close(fd)
        except OSError as exc:
            raise WriteError(self.path, exc) from None
        self.rows, self.size = count, self.size + len(data)


def read_rows_file(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The rows of a ``rows-RRRRR.bin`` file: the newest copy of each row, up to the
    last whole chunk (a torn or corrupt trailing chunk is ignored)."""
    data = Path(path).read_bytes()
    if not data.startswith(ROWS_MAGIC):
        raise ValueError(f"{path} is not a syncbench rows file")
    line_end = data.index(b"\n", len(ROWS_MAGIC))
    header = json.loads(data[len(ROWS_MAGIC):line_end])
    dtype = np.dtype([(name, np.dtype(dt)) for name, dt in header["columns"]])
    pieces: list[tuple[int, np.ndarray]] = []
    count, pos = 0, line_end + 1
    while pos + _CHUNK.size <= len(data):
        tag, start, n, crc = _CHUNK.unpack_from(data, pos)
        payload = data[pos + _CHUNK.size: pos + _CHUNK.size + n * dtype.itemsize]
        if tag != _CHUNK_TAG or start > count or len(payload) != n * dtype.itemsize \
                or zlib.crc32(payload) != crc:
            break  # torn (a flush cut short) or corrupt: what follows is not trusted
        pieces.append((start, np.frombuffer(payload, dtype=dtype)))
        count = start + n  # a chunk starts at or before the previous end, and ends the rows
        pos += _CHUNK.size + len(payload)
    records = np.zeros(count, dtype=dtype)
    for start, chunk in pieces:
        records[start:start + len(chunk)] = chunk
    return {name: np.asarray(records[name], dtype=dt) if name in dtype.names
            else np.full(count, schema.RANK_COLUMN_DEFAULTS.get(name, 0), dtype=dt)
            for name, dt in schema.RANK_COLUMNS.items()}


def read_rows(folder: Path, rank: int) -> tuple[dict[str, np.ndarray], dict[str, Any],
                                                  dict[str, np.ndarray] | None]:
    """Rank ``rank``'s flushed rows, attributes and (rank 0) evaluation rows; from
    ``rows-RRRRR.bin`` and its side files, else an older version's ``rows-RRRRR.npz``."""
    path = _rows_path(folder, rank)
    if not path.exists():
        with np.load(folder / f"rows-{rank:05d}.npz") as data:
            rows = {k: data[f"row_{k}"] for k in schema.RANK_COLUMNS}
            evals = ({k: data[f"eval_{k}"] for k in schema.EVAL_COLUMNS}
                     if "eval_t" in data else None)
            return rows, json.loads(str(data["attrs"])), evals
    attrs_path = folder / f"attrs-{rank:05d}.json"
    attrs = json.loads(attrs_path.read_text()) if attrs_path.exists() else {}
    evals = None
    if rank == 0 and (folder / "evals.npz").exists():
        with np.load(folder / "evals.npz") as data:
            evals = {k: data[k] for k in schema.EVAL_COLUMNS}
    return read_rows_file(path), attrs, evals


def flushed_ranks(folder: Path) -> list[int]:
    """Ranks with a rows file in ``folder`` (either format)."""
    return sorted({int(p.name.split("-")[1].split(".")[0])
                   for pattern in ("rows-*.bin", "rows-*.npz") for p in folder.glob(pattern)})


def recover(out: str | os.PathLike, overwrite: bool = False) -> dict[str, float]:
    """Rebuild a partial run file (``complete=False``) from ``out``'s parts folder;
    ``ValueError`` (one line) while a run holds ``out``'s lock."""
    out = Path(out)
    folder = parts_dir(out)
    if not (folder / "meta.json").exists():
        raise FileNotFoundError(f"{folder}/meta.json not found: nothing to recover for {out}")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
    lock = run_lock(out)
    if os.access(out.parent, os.W_OK):  # else the write fails, naming the run file
        problem = take_lock(lock, "syncbench recover")
        if problem:  # a run writes this file now: its parts are not a crashed run's
            raise ValueError(problem)
    try:
        return _recover(out, folder)
    finally:
        lock.release()  # nothing when it was not taken


def _recover(out: Path, folder: Path) -> dict[str, float]:
    """:func:`recover` once the run file is locked."""
    from syncbench.bench.train.recorder import write_run_file  # lazy: recorder imports this

    meta = json.loads((folder / "meta.json").read_text())
    rank_rows: dict[int, dict[str, np.ndarray]] = {}
    rank_attrs: dict[int, dict[str, Any]] = {}
    evals = {name: np.zeros(0, dtype=dt) for name, dt in schema.EVAL_COLUMNS.items()}
    for rank in flushed_ranks(folder):
        rank_rows[rank], rank_attrs[rank], rank_evals = read_rows(folder, rank)
        if rank_evals is not None:
            evals = rank_evals
    if not rank_rows:
        raise FileNotFoundError(f"no rows-*.bin in {folder}: no rank flushed any step")
    wall = max(
        (float(r["t_start"][-1] + sum(r[f"t_{p}"][-1] for p in schema.PHASES))
         for r in rank_rows.values() if len(r["t_start"])),
        default=0.0,
    )
    root = dict(meta["root"])
    return write_run_file(out, root, rank_rows, rank_attrs, evals, wall,
                          meta.get("target_accuracy"), complete=False,
                          target_loss=meta.get("target_loss"))


# -- resumable state ---------------------------------------------------------
def _state_path(folder: Path, rank: int, step: int) -> Path:
    return folder / f"state-{rank:05d}-s{step:09d}.h5"


def save_state(folder: Path, rank: int, step: int, state: Mapping[str, Any]) -> None:
    """Write rank ``rank``'s state at ``step`` atomically (one HDF5 file, built in memory)."""
    _make_folder(folder)
    write_atomic(_state_path(folder, rank, step), hdf5_image(lambda f: _write_tree(f, state)))


#: What a checkpoint must share with the run that resumes it: key, and its name in errors.
IDENTITY = {"algorithm": "strategy", "model": "model", "dataset": "dataset",
            "world_size": "world size", "batch_size": "batch size", "seed": "seed",
            "total_samples": "sample budget", "compress": "--compress",
            "quantize": "--quantize"}


def run_identity(config: TrainConfig, world_size: int,
                 total_samples: int) -> dict[str, Any]:
    """The run's identity recorded with its checkpoints (:data:`IDENTITY`'s keys)."""
    return {"algorithm": config.algorithm, "model": config.model, "dataset": config.dataset,
            "world_size": int(world_size), "batch_size": int(config.batch_size),
            "seed": int(config.seed), "total_samples": int(total_samples),
            "compress": str(getattr(config, "compress", "none")),
            "quantize": str(getattr(config, "quantize", "none"))}


def commit_checkpoint(folder: Path, step: int, world_size: int,
                      identity: Mapping[str, Any] | None = None) -> None:
    """Rank 0, after every rank saved ``step``: name it the newest and drop older states.

    ``identity`` (:func:`run_identity`) is recorded for :func:`latest_checkpoint`.
    """
    info = {"step": step, "world_size": world_size, **dict(identity or {})}
    write_atomic(folder / "checkpoint.json", json.dumps(info).encode())
    for old in folder.glob("state-*-s*.h5"):
        if int(old.stem.split("-s")[1]) < step:
            old.unlink(missing_ok=True)


def latest_checkpoint(folder: Path, world_size: int,
                      identity: Mapping[str, Any] | None = None) -> int:
    """Step of the newest complete checkpoint; ``ValueError`` if none fits this job.

    With ``identity`` (:func:`run_identity`), every key the checkpoint recorded
    must match: the error names the first that does not.
    """
    marker = folder / "checkpoint.json"
    if not marker.exists():
        raise ValueError(f"--resume: no checkpoint in {folder} (run with --checkpoint-every)")
    info = json.loads(marker.read_text())
    if info["world_size"] != world_size:
        raise ValueError(f"--resume: the checkpoint in {folder} is for {info['world_size']} "
                         f"ranks, this job has {world_size}")
    for key, label in IDENTITY.items():
        if identity is not None and key in info and key in identity \
                and info[key] != identity[key]:
            raise ValueError(f"--resume: the checkpoint in {folder} is for {label} "
                             f"{info[key]}, this run is {identity[key]}")
    return int(info["step"])


def load_state(folder: Path, rank: int, step: int) -> dict[str, Any]:
    """Read what :func:`save_state` wrote."""
    path = _state_path(folder, rank, step)
    if not path.exists():
        raise ValueError(f"--resume: {path} is missing")
    with h5py.File(path, "r") as f:
        return _read_tree(f)


def _write_tree(group: h5py.Group, tree: Mapping[str, Any]) -> None:
    for key, value in tree.items():
        if isinstance(value, Mapping):
            _write_tree(group.create_group(key), value)
        elif isinstance(value, str):
            group.attrs[key] = value
        else:
            group.create_dataset(key, data=np.asarray(value))


def _read_tree(group: h5py.Group) -> dict[str, Any]:
    tree: dict[str, Any] = {k: (v.decode() if isinstance(v, bytes) else v)
                            for k, v in group.attrs.items()}
    for key, item in group.items():
        if isinstance(item, h5py.Group):
            tree[key] = _read_tree(item)
        else:
            value = item[()]
            tree[key] = value.item() if np.ndim(value) == 0 else np.array(value)
    return tree


def remove_parts(out: str | os.PathLike) -> None:
    """A run completed: its crash-safety folder is no longer needed."""
    shutil.rmtree(parts_dir(out), ignore_errors=True)
