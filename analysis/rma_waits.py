"""ASGD's counter epochs set beside rank 0's window epochs (a run with ``--events on``).

ASGD's counters live on rank 0 (``algorithms/windows.py``'s ``Counters``): every other
rank's read, start and count is a request to rank 0 and a reply from it. Over a
transport without hardware one-sided operations (MPICH's CH4 over UCX's TCP) every
message between two ranks rides one connection, in order, so a request or reply of a
few bytes queued behind a window epoch's data waits until that data has left. This
table says whether it does: per rank, the median seconds of its counter epochs and of
its window epochs, and for a rank other than 0 its counter epochs posted while rank 0
had a pull or a push in flight, how long they took, and how far their end fell from
the end of that epoch of rank 0 (about 0 when they waited for it).

    python -m syncbench.analysis.rma_waits RUN.h5 [RUN.h5 ...]

The event times are on the run's clock (``bench/train/events.py``), which puts the
ranks of one host, or of clocks aligned within the recorded bound, on one axis.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

import numpy as np

from syncbench.analysis.collectives import RankEvents, read_events
from syncbench.analysis.runfile import RunFileError

#: The event kinds read here (``schema.EVENT_KINDS``' names).
COUNTER, PULL, PUSH = "rma_counter", "rma_pull", "rma_push"


@dataclass(frozen=True)
class Overlap:
    """A rank's counter epochs posted while rank 0 had one kind of window epoch in flight."""

    count: int
    median_s: float
    #: Median of (the counter epoch's end - the end of rank 0's epoch it was posted in).
    end_after_s: float


@dataclass(frozen=True)
class RankWaits:
    rank: int
    counters: int
    counter_s: float
    pull_s: float
    push_s: float
    #: Rank 0's pull and push in flight at the post, and neither (None for rank 0).
    during_pull: Overlap | None = None
    during_push: Overlap | None = None
    apart: Overlap | None = None


def _of(events: RankEvents, kind: str) -> tuple[np.ndarray, np.ndarray]:
    if kind not in events.names:
        return np.zeros(0), np.zeros(0)
    chosen = events.columns["kind"] == events.names.index(kind)
    post, done = events.columns["t_post"][chosen], events.columns["t_done"][chosen]
    order = np.argsort(post, kind="stable")
    return post[order], done[order]


def _median(values: np.ndarray) -> float:
    return float(np.median(values)) if values.size else float("nan")


def _overlap(took: np.ndarray, after: np.ndarray) -> Overlap:
    return Overlap(int(took.size), _median(took), _median(after))


def rank_waits(events: dict[int, RankEvents]) -> list[RankWaits]:
    """Per rank (in rank order), its counter and window epochs; see the module doc."""
    if 0 not in events:
        return []
    spans = {kind: _of(events[0], kind) for kind in (PULL, PUSH)}
    out = []
    for rank, own in sorted(events.items()):
        post, done = _of(own, COUNTER)
        took = done - post
        (pull_post, pull_done), (push_post, push_done) = (_of(own, k) for k in (PULL, PUSH))
        pulls, pushes = pull_done - pull_post, push_done - push_post
        row = dict(rank=rank, counters=int(post.size), counter_s=_median(took),
                   pull_s=_median(pulls), push_s=_median(pushes))
        if rank != 0:
            inside = {}
            for kind, (start, end) in spans.items():
                # the epoch of rank 0 in flight at each post (epochs of one rank do not overlap)
                at = np.searchsorted(start, post, side="right") - 1
                ends = end[np.maximum(at, 0)] if len(end) else np.full(len(post), -np.inf)
                hit = inside[kind] = (at >= 0) & (post < ends)
                row[f"during_{kind[4:]}"] = _overlap(took[hit], (done - ends)[hit])
            neither = ~(inside[PULL] | inside[PUSH])
            row["apart"] = _overlap(took[neither], np.zeros(int(neither.sum())))
        out.append(RankWaits(**row))
    return out


def _ms(value: float) -> str:
    return "-" if not np.isfinite(value) else f"{1e3 * value:.2f}"


def format_waits(path: str, rows: list[RankWaits]) -> str:
    """The table of :func:`rank_waits` for one run, in milliseconds."""
    lines = [f"# {path}",
             "rank  counter epochs  counter ms  pull ms  push ms  | posted in rank 0's "
             "push: n, ms, end - its end | in its pull: n, ms, end - its end | apart: n, ms"]
    for w in rows:
        head = (f"{w.rank:>4}  {w.counters:>14}  {_ms(w.counter_s):>10}  {_ms(w.pull_s):>7}  "
                f"{_ms(w.push_s):>7}")
        if w.during_push is None:
            lines.append(head)
            continue
        parts = [f"{o.count}, {_ms(o.median_s)}, {_ms(o.end_after_s)}"
                 for o in (w.during_push, w.during_pull)]
        lines.append(f"{head}  | {parts[0]:>24} | {parts[1]:>24} | "
                     f"{w.apart.count}, {_ms(w.apart.median_s)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m syncbench.analysis.rma_waits",
        description="ASGD's counter epochs beside rank 0's window epochs (--events on runs)")
    parser.add_argument("runs", nargs="+", metavar="RUN.h5")
    args = parser.parse_args(argv)
    for path in args.runs:
        if not os.path.isfile(path):
            print(f"rma_waits: {path}: no such file", file=sys.stderr)
            return 2
        try:
            events = read_events(path)
        except RunFileError as exc:
            print(f"rma_waits: {exc}", file=sys.stderr)
            return 2
        if not events:
            print(f"rma_waits: {path} has no events (train it with --events on)",
                  file=sys.stderr)
            return 2
        rows = rank_waits(events)
        if not any(w.counters for w in rows):
            print(f"rma_waits: {path} has no rma_counter events (an ASGD run recorded "
                  "with --events on)", file=sys.stderr)
            return 2
        print(format_waits(path, rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
