"""The ``/summary`` numbers of a run, defined once.

The recorder calls :func:`summarize` when it writes a run file, and the
readers only read what it stored, so these definitions live here and nowhere
else.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from .schema import EVAL_COLUMNS, RANK_COLUMNS, SUMMARY_ATTRS, SUMMARY_FLAGS
from .targets import Target, target_of

NAN = float("nan")

# The columns the summary reads; checked against the schema at import time.
_SAMPLES, _T_COMM, _T_WAIT = "samples", "t_comm", "t_wait"
_T, _LOSS, _ACCURACY = "t", "loss", "accuracy"
if not {_SAMPLES, _T_COMM, _T_WAIT} <= RANK_COLUMNS.keys() or not {
    _T, _LOSS, _ACCURACY
} <= EVAL_COLUMNS.keys():  # pragma: no cover - guards a schema edit
    raise ImportError("syncbench.analysis.summary is out of step with schema.py")


def _column(rows: Mapping[str, np.ndarray], name: str) -> np.ndarray:
    """``rows[name]`` as a 1-D array; an absent column is an empty one."""
    if name not in rows:
        return np.zeros(0)
    return np.ravel(np.asarray(rows[name]))


def _total(rank_rows: Mapping[int, Mapping[str, np.ndarray]], name: str) -> float:
    """Sum of column ``name`` over every row of every rank."""
    return float(sum(float(np.sum(_column(rows, name), dtype=np.float64))
                     for rows in rank_rows.values()))


def time_to_target(eval_rows: Mapping[str, np.ndarray], target: float | Target) -> float:
    """``t`` of the first evaluation row that reaches ``target``; NaN if none.

    A float is a target accuracy (``accuracy >= target``); a :class:`Target` of a
    loss is reached at ``loss <= target`` (:mod:`.targets`). The one definition of
    time to target (the ``/summary`` value, the report's ``--target-accuracy`` and
    ``--target-loss`` and the scenario runner all call it).
    """
    if not isinstance(target, Target):
        target = Target("accuracy", float(target))
    values = _column(eval_rows, target.metric).astype(np.float64, copy=False)
    t = _column(eval_rows, _T).astype(np.float64, copy=False)
    n = min(values.size, t.size)
    hits = np.flatnonzero(target.reached(values[:n]))
    return float(t[hits[0]]) if hits.size else NAN


def summarize(
    rank_rows: Mapping[int, Mapping[str, np.ndarray]],
    eval_rows: Mapping[str, np.ndarray],
    wall_s: float,
    target_accuracy: float | None,
    target_loss: float | None = None,
) -> dict[str, float]:
    """Summary of one run: exactly the keys of ``schema.SUMMARY_ATTRS``.

    ``rank_rows`` maps each rank to its columns (``schema.RANK_COLUMNS``),
    ``eval_rows`` holds the evaluation columns (``schema.EVAL_COLUMNS``) in the
    order they were recorded; ``world_size`` is the number of ranks that
    recorded at least one step (ranks that only serve, such as ASGD's
    dedicated host, take no steps and are left out of the fractions).

    - ``wall_s``: the given wall-clock time of the run, in seconds.
    - ``samples_per_s``: the ``samples`` column summed over every row of every
      rank, divided by ``wall_s``.
    - ``final_accuracy`` / ``final_loss``: ``accuracy`` / ``loss`` of the last
      evaluation row; NaN if there are no evaluation rows.
    - ``time_to_target_s``: ``t`` of the first evaluation row whose
      ``accuracy >= target_accuracy`` (or ``loss <= target_loss``, a language
      model's target); NaN if there is no target or it is never reached.
    - ``comm_fraction``: ``t_comm`` summed over every row of every rank,
      divided by ``world_size * wall_s`` (the share of all ranks' time spent
      inside MPI calls that post or complete communication).
    - ``wait_fraction``: the same with ``t_wait`` (time blocked on a request
      or barrier).

    If ``wall_s`` is not positive (or NaN), ``samples_per_s`` and both
    fractions are NaN; with no ranks the fractions are NaN.
    """
    wall = float(wall_s)
    world_size = sum(1 for rows in rank_rows.values() if _column(rows, _SAMPLES).size)
    wall_ok = math.isfinite(wall) and wall > 0

    samples_per_s = _total(rank_rows, _SAMPLES) / wall if wall_ok else NAN
    if wall_ok and world_size > 0:
        comm_fraction = _total(rank_rows, _T_COMM) / (world_size * wall)
        wait_fraction = _total(rank_rows, _T_WAIT) / (world_size * wall)
    else:
        comm_fraction = wait_fraction = NAN

    accuracy = _column(eval_rows, _ACCURACY).astype(np.float64, copy=False)
    loss = _column(eval_rows, _LOSS).astype(np.float64, copy=False)
    final_accuracy = float(accuracy[-1]) if accuracy.size else NAN
    final_loss = float(loss[-1]) if loss.size else NAN

    target = target_of(target_accuracy, target_loss)
    time_to_target_s = NAN if target is None else time_to_target(eval_rows, target)

    out = {
        "wall_s": wall,
        "samples_per_s": float(samples_per_s),
        "final_accuracy": final_accuracy,
        "final_loss": final_loss,
        "time_to_target_s": time_to_target_s,
        "comm_fraction": float(comm_fraction),
        "wait_fraction": float(wait_fraction),
    }
    if tuple(out) != SUMMARY_ATTRS:  # pragma: no cover - guards a schema edit
        raise RuntimeError("summarize() is out of step with schema.SUMMARY_ATTRS")
    return out


#: A run whose final accuracy is at most this many times chance (1/classes) diverged.
DIVERGED_CHANCE_MULTIPLE = 1.5
#: Classes of the datasets that files written before ``diverged`` existed may name.
_DATASET_CLASSES = {"mnist": 10, "fashion-mnist": 10, "cifar10": 10, "shakespeare": 256}
_DIVERGED = "diverged"
if _DIVERGED not in SUMMARY_FLAGS:  # pragma: no cover - guards a schema edit
    raise ImportError("syncbench.analysis.summary is out of step with schema.py")


def divergence(
    rank_rows: Mapping[int, Mapping[str, np.ndarray]],
    eval_rows: Mapping[str, np.ndarray],
    num_classes: int | None,
) -> str | None:
    """Why a run diverged (one phrase), or None if it did not.

    A run diverged when some rank's training ``loss`` is non-finite at some
    step, or when its final accuracy (the last evaluation row) is at most
    1.5 x chance, ``1.5 / num_classes``: training that went nowhere must not
    count as fast (a throughput "win" of a strategy whose model is random).
    The accuracy test is skipped when ``num_classes`` is None or there are
    no evaluation rows. A language model has no accuracy (every row NaN): its
    final validation loss must instead be below ``ln(num_classes)``, what
    guessing every token uniformly scores.
    """
    for rank in sorted(rank_rows):
        loss = _column(rank_rows[rank], _LOSS).astype(np.float64, copy=False)
        bad = np.flatnonzero(~np.isfinite(loss))
        if bad.size:
            steps = _column(rank_rows[rank], "step")
            step = int(steps[bad[0]]) if steps.size > bad[0] else int(bad[0])
            return f"non-finite training loss on rank {rank} at step {step}"
    accuracy = _column(eval_rows, _ACCURACY).astype(np.float64, copy=False)
    if num_classes and accuracy.size and np.isnan(accuracy).all():
        final, limit = float(_column(eval_rows, _LOSS)[-1]), math.log(num_classes)
        if not math.isfinite(final) or final >= limit:
            return f"final loss {final:.4f} nats/token >= ln({num_classes}) (uniform guessing)"
    elif num_classes and accuracy.size:
        final, limit = float(accuracy[-1]), DIVERGED_CHANCE_MULTIPLE / num_classes
        if not math.isfinite(final) or final <= limit:
            return (f"final accuracy {final:.4f} <= {DIVERGED_CHANCE_MULTIPLE:g} x chance "
                    f"({limit:.4f})")
    return None


def run_diverged(run: Any) -> bool:
    """The ``diverged`` flag of a read run (:class:`syncbench.analysis.runfile.Run`).

    Files written before the flag existed get it recomputed from their rows
    (the accuracy test only for datasets of known class count).
    """
    stored = getattr(run, "summary_extra", {}).get(_DIVERGED)
    if stored is not None and stored != "":
        return bool(stored)
    classes = _DATASET_CLASSES.get(str(run.attrs.get("dataset", "")))
    return divergence(run.ranks, run.eval, classes) is not None
