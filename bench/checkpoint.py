"""Crash safety: per-rank row checkpoints, resumable state, and recovery.

Next to the run file ``RUN.h5`` a run keeps a folder ``RUN.h5.parts/``:

* ``rows-RRRRR.npz``: rank R's step rows (and, on rank 0, the evaluation
  rows), rewritten atomically every ``--flush-every`` seconds, so a job that
  dies leaves its timings readable; ``meta.json`` holds the root attributes.
  ``syncbench recover RUN.h5`` rebuilds a partial run file from them,
  marked ``complete=False``.
* ``state-RRRRR-sSSSSSSSS.h5``: rank R's resumable state at step S
  (``--checkpoint-every``), and ``checkpoint.json`` naming the newest step
  for which EVERY rank's state was written (rank 0 writes it after a
  barrier), so ``--resume`` never mixes generations.
* ``heartbeat-RRRRR``: the rank's last step and time, read by the hang guard.

A run that completes removes the folder; what exists after a crash is
exactly what was flushed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from syncbench.analysis import schema


def parts_dir(out: str | os.PathLike) -> Path:
    """The side folder of run file ``out``."""
    out = Path(out)
    return out.with_name(out.name + ".parts")


def _atomic_replace(tmp: Path, final: Path) -> None:
    os.replace(tmp, final)


def write_meta(folder: Path, root_attrs: Mapping[str, Any], target: float | None) -> None:
    """Root attributes of the run (rank 0, once at the start)."""
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / ".meta.json.tmp"
    tmp.write_text(json.dumps({"root": dict(root_attrs), "target_accuracy": target},
                              default=str))
    _atomic_replace(tmp, folder / "meta.json")


def flush_rows(folder: Path, rank: int, rows: Mapping[str, np.ndarray],
               rank_attrs: Mapping[str, Any], evals: Mapping[str, np.ndarray] | None) -> None:
    """Rewrite rank ``rank``'s rows file atomically."""
    arrays = {f"row_{k}": v for k, v in rows.items()}
    if evals is not None:
        arrays.update({f"eval_{k}": v for k, v in evals.items()})
    arrays["attrs"] = np.array(json.dumps(dict(rank_attrs), default=str))
    tmp = folder / f".rows-{rank:05d}.tmp.npz"
    np.savez(tmp, **arrays)
    _atomic_replace(tmp, folder / f"rows-{rank:05d}.npz")


def recover(out: str | os.PathLike, overwrite: bool = False) -> dict[str, float]:
    """Rebuild a partial run file (``complete=False``) from ``out``'s parts folder."""
    from syncbench.bench.recorder import write_run_file  # noqa: PLC0415

    out = Path(out)
    folder = parts_dir(out)
    if not (folder / "meta.json").exists():
        raise FileNotFoundError(f"{folder}/meta.json not found: nothing to recover for {out}")
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; pass --overwrite to replace it")
    meta = json.loads((folder / "meta.json").read_text())
    rank_rows: dict[int, dict[str, np.ndarray]] = {}
    rank_attrs: dict[int, dict[str, Any]] = {}
    evals = {name: np.zeros(0, dtype=dt) for name, dt in schema.EVAL_COLUMNS.items()}
    for path in sorted(folder.glob("rows-*.npz")):
        rank = int(path.stem.split("-")[1])
        with np.load(path) as data:
            rank_rows[rank] = {k: data[f"row_{k}"] for k in schema.RANK_COLUMNS}
            rank_attrs[rank] = json.loads(str(data["attrs"]))
            if "eval_t" in data:
                evals = {k: data[f"eval_{k}"] for k in schema.EVAL_COLUMNS}
    if not rank_rows:
        raise FileNotFoundError(f"no rows-*.npz in {folder}: no rank flushed any step")
    wall = max(
        (float(r["t_start"][-1] + sum(r[f"t_{p}"][-1] for p in schema.PHASES))
         for r in rank_rows.values() if len(r["t_start"])),
        default=0.0,
    )
    root = dict(meta["root"])
    return write_run_file(out, root, rank_rows, rank_attrs, evals, wall,
                          meta.get("target_accuracy"), complete=False)


# -- resumable state ---------------------------------------------------------
def _state_path(folder: Path, rank: int, step: int) -> Path:
    return folder / f"state-{rank:05d}-s{step:09d}.h5"


def save_state(folder: Path, rank: int, step: int, state: Mapping[str, Any]) -> None:
    """Write rank ``rank``'s state at ``step`` atomically (one HDF5 file)."""
    folder.mkdir(parents=True, exist_ok=True)
    final = _state_path(folder, rank, step)
    tmp = final.with_suffix(".tmp")
    with h5py.File(tmp, "w") as f:
        _write_tree(f, state)
    _atomic_replace(tmp, final)


def commit_checkpoint(folder: Path, step: int, world_size: int) -> None:
    """Rank 0, after every rank saved ``step``: name it the newest and drop older states."""
    tmp = folder / ".checkpoint.json.tmp"
    tmp.write_text(json.dumps({"step": step, "world_size": world_size}))
    _atomic_replace(tmp, folder / "checkpoint.json")
    for old in folder.glob("state-*-s*.h5"):
        if int(old.stem.split("-s")[1]) < step:
            old.unlink(missing_ok=True)


def latest_checkpoint(folder: Path, world_size: int) -> int:
    """Step of the newest complete checkpoint; ``ValueError`` if none fits this job."""
    marker = folder / "checkpoint.json"
    if not marker.exists():
        raise ValueError(f"--resume: no checkpoint in {folder} (run with --checkpoint-every)")
    info = json.loads(marker.read_text())
    if info["world_size"] != world_size:
        raise ValueError(f"--resume: checkpoint in {folder} is for {info['world_size']} ranks, "
                         f"this job has {world_size}")
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


def add_recover_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``syncbench recover``."""
    parser.add_argument("run", metavar="RUN.h5", help="the run file the crashed job was writing")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing RUN.h5")


def recover_main(args: argparse.Namespace) -> int:
    """Body of ``syncbench recover``."""
    try:
        summary = recover(args.run, overwrite=args.overwrite)
    except (OSError, ValueError, KeyError) as exc:
        print(f"syncbench recover: {exc}", file=sys.stderr)
        return 2
    print(f"{args.run}: partial run rebuilt (complete=False), "
          f"{summary['samples_per_s']:.1f} samples/s over {summary['wall_s']:.2f} s")
    return 0
