"""``syncbench trace``: every rank's per-step phases as a Chrome trace (Perfetto, chrome://tracing).

The output is the Chrome Trace Event Format (a JSON object with
``"traceEvents"``; times in microseconds):

- one process per rank: ``pid`` = rank, ``tid`` = 0, with ``process_name``
  ("rank R (host)"), ``process_sort_index`` and ``thread_name`` metadata
  (``"ph": "M"``) events;
- per step per rank, one enclosing complete slice (``"cat": "step"``, name
  ``step N``) and inside it one slice (``"cat": "phase"``) per phase that
  lasted longer than 0 ns. The run file stores seconds per phase per step, not
  when inside the step each phase ran, so the phases of a step are drawn back
  to back from ``t_start`` in the order the run's strategy runs them (its
  ``step_order`` trait), on integer-nanosecond boundaries that never
  overlap; ``args`` hold the step's row;
- one global instant event (``"ph": "i"``, ``"s": "g"``) per evaluation, on
  rank 0's track at the end of rank 0's step ``eval.step - 1``: ``"cat":
  "eval"`` where training paused for it, ``"cat": "snapshot"`` where the
  strategy evaluates copies of the parameters after training (its
  ``snapshot_evaluations`` trait); ``args`` hold the evaluation's row;
- for a run recorded with ``--events``, the collectives as they happened:
  per rank one slice (``"cat": "collective"``, named after its kind) per call,
  from its post to the completion the rank saw, at the recorded times (not laid
  out), on tracks ``tid`` >= 1 named "collectives" (overlapping calls, such as
  SSGD's buckets in flight together, go on further tracks of the rank, first
  fit); ``args`` hold its step, index (SSGD's bucket), bytes and wait.

RUN may be a results file or a folder of runs (:func:`.inputs.first_run`): the
baseline's first run is traced, and a line says which file that is.

``--steps A:B`` keeps the steps with ``A <= step < B`` (either bound may be
omitted) and the evaluations that followed one of them. A run of more ranks
than ``--max-ranks`` (default :data:`DEFAULT_MAX_RANKS`; 0: no limit) is traced
for a sample of that many (:func:`sample_ranks`: evenly spaced over the ranks,
always with the first rank and the slowest one, the report's ``slowest_rank``):
a trace of every rank of a 16,384-rank run is ~600,000 slices, more than a
browser opens. The command says so in a line, and ``otherData["ranks_sampled"]``
records the sample (which ranks, of how many, why). Timestamps are on the
run's one clock: rank 0's ``CLOCK_MONOTONIC`` from its exit of the barrier that
starts the run, each rank's rows mapped onto it through the rank's measured
offset (rank attributes ``clock_offset_s`` / ``clock_uncertainty_s``), so ranks on
different nodes line up to within that uncertainty.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from syncbench.analysis.inputs import first_run
from syncbench.analysis.runfile import RunFileError, read_run
from syncbench.analysis.trace import DEFAULT_MAX_RANKS, in_window, parse_steps, write_trace

HELP = "Chrome/Perfetto trace of every rank's phases"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``syncbench trace``."""
    parser.add_argument("run", metavar="RUN.h5", help="run file (syncbench/1), or a results "
                        "file or folder of runs: its baseline's first run")
    parser.add_argument("-o", "--out", required=True, metavar="trace.json",
                        help="Chrome trace to write (open in https://ui.perfetto.dev "
                        "or chrome://tracing)")
    parser.add_argument("--steps", default=None, metavar="A:B",
                        help="only steps A <= step < B (A: or :B for open ends)")
    parser.add_argument("--beside", default=None, metavar="RUN2.h5",
                        help="a second run drawn below the first, each from its own first "
                        "step (e.g. a measured run and simulate --validate --out-dir's "
                        "prediction of it)")
    parser.add_argument("--max-ranks", type=int, default=DEFAULT_MAX_RANKS, metavar="N",
                        help=f"trace at most N ranks (default {DEFAULT_MAX_RANKS}; 0: every "
                        "rank): a larger run is traced for N of them, evenly spaced, "
                        "with the first and the slowest, and the output says so")


def run(args: argparse.Namespace) -> int:
    """Body of ``syncbench trace``; returns the exit status (2 on a bad file or flag)."""
    max_ranks = int(getattr(args, "max_ranks", DEFAULT_MAX_RANKS))
    try:
        if max_ranks < 0:
            raise ValueError(f"--max-ranks {max_ranks}: need N >= 0 (0: every rank)")
        window = parse_steps(args.steps)
        path, note = first_run(args.run)  # a results file or a folder: one of its runs
        run = read_run(path)
        beside = read_run(args.beside) if getattr(args, "beside", None) else None
    except (RunFileError, ValueError) as exc:
        print(f"syncbench trace: {exc}", file=sys.stderr)
        return 2
    if note:
        print(f"syncbench trace: {note}", file=sys.stderr)
    if not run.complete:
        print(f"syncbench trace: warning: {run.path} is partial (complete=False); "
              f"tracing the {len(run.ranks)} of {run.world_size} ranks it holds",
              file=sys.stderr)
    try:
        info = write_trace(run, args.out, window, max_ranks, beside)
    except RunFileError as exc:  # its events (--events on) could not be read
        print(f"syncbench trace: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"syncbench trace: cannot write {args.out}: {exc}", file=sys.stderr)
        return 2
    sample = info.get("ranks_sampled")
    if sample is not None:
        print(f"syncbench trace: {sample['of']} ranks, more than --max-ranks "
              f"{sample['max_ranks']}: tracing a sample of {len(sample['ranks'])} ranks "
              f"(evenly spaced, with rank {sample['ranks'][0]} and the slowest, rank "
              f"{sample['slowest']}; --max-ranks 0 traces every rank; the trace's "
              "otherData.ranks_sampled lists them)", file=sys.stderr)
    traced = sample["ranks"] if sample is not None else list(run.ranks)
    steps = sum(int(np.count_nonzero(in_window(run.ranks[r]["step"], window))) for r in traced)
    print(f"syncbench trace: {steps} steps, {info['phase_slices']} phase slices (zero-length "
          f"phases left out) of {len(traced)} ranks -> {args.out}", file=sys.stderr)
    return 0
