"""Recorded collective events (``--events on``): the bounded log, the run file, trace, report.

The log's bounds are serial. Under ``mpiexec -n 2`` real runs record every call
where the communicator makes it: SSGD overlap posts one ``Iallreduce`` per bucket
per step whose bytes add up to the gradient, in bucket order, each completing
after its post and inside its step; blocking SSGD one ``Allreduce``; ASGD one pull
and one push epoch and four counter epochs; Oscars and Local SGD one reduction per
round, at its last step; OD-SGD's reduction completes in the next step. The trace draws them at the
recorded times and the report's table counts them. A run without the flag has no
events, so nothing changes for it (the old outputs are compared byte for byte
elsewhere).

Split off this module: ``tests/unit/test_events_unit.py`` (its tests that need neither) and
``tests/e2e/test_events_e2e.py`` (its tests that launch a process or start MPI).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import train_config

from syncbench.analysis import schema
from syncbench.bench.train.events import KIND, EventLog

ALLREDUCE, IALLREDUCE = KIND["allreduce"], KIND["iallreduce"]  # the stored codes


# -- real runs (mpiexec -n 2) ---------------------------------------------------------
SMALL = ["--dataset", "synthetic", "--synthetic-samples", "512", "--batch-size", "16",
         "--progress", "never", "--eval-every", "0"]


def _train(out: Path, *flags: str):
    """Train with ``flags`` on every rank; rank 0 returns the run and its events."""
    from mpi4py import MPI

    from syncbench.analysis.collectives import read_events
    from syncbench.analysis.runfile import read_run
    from syncbench.bench.train.driver import run_training

    run_training(train_config(*SMALL, "--out", str(out), *flags), MPI.COMM_WORLD)
    MPI.COMM_WORLD.Barrier()
    return read_run(out), read_events(out)


def _grad_nbytes() -> int:
    from syncbench.kernels.zoo import build_model

    return build_model("mlp", (1, 28, 28), 10, dtype=np.float32).grads.nbytes


def _within_steps(rows: dict, cols: dict) -> None:
    """Every event was posted in its step and completed before the next step began."""
    starts = dict(zip(rows["step"].tolist(), rows["t_start"].tolist()))
    for step, post, done in zip(cols["step"], cols["t_post"], cols["t_done"]):
        assert starts[int(step)] <= post < done, (step, post, done)
        if int(step) + 1 in starts:
            assert done <= starts[int(step) + 1]


@pytest.mark.mpi(min_size=2)
def test_ssgd_overlap_records_every_bucket_of_every_step_and_trace_and_report_show_them(
        capsys, shared_tmp):
    from syncbench.analysis.collectives import collective_rows
    from syncbench.analysis.trace import trace_events
    from syncbench.bench.commands import report as report_command

    out = shared_tmp / "overlap.h5"
    run, events = _train(out, "--algorithm", "ssgd", "--comm", "overlap", "--events", "on")
    buckets = int(run.attrs["buckets"])
    assert buckets >= 2 and sorted(events) == sorted(run.ranks)
    for rank, rank_events in events.items():
        cols, rows = rank_events.columns, run.ranks[rank]
        assert rank_events.stride == 1 and rank_events.attrs["dropped"] == 0
        assert set(cols["kind"].tolist()) == {IALLREDUCE}
        steps = rows["step"].tolist()
        assert len(cols["step"]) == len(steps) * buckets
        for step in steps:
            mine = cols["step"] == step
            assert cols["index"][mine].tolist() == list(range(buckets))  # bucket order
            assert int(cols["bytes"][mine].sum()) == _grad_nbytes()
            assert np.all(np.diff(cols["t_post"][mine]) > 0)  # posted one after another
        _within_steps(rows, cols)
        assert np.all(cols["wait_s"] >= 0)
        assert cols["wait_s"].sum() <= rows["t_wait"].sum() + 1e-6  # the wait phase holds it

    # the trace: one collective slice per event, at the recorded post and completion
    trace = trace_events(run)["traceEvents"]
    for rank, rank_events in events.items():
        slices = [e for e in trace if e.get("cat") == "collective" and e["pid"] == rank]
        cols = rank_events.columns
        assert len(slices) == len(cols["step"])
        got = sorted((e["ts"], e["ts"] + e["dur"]) for e in slices)
        want = sorted(zip(np.rint(cols["t_post"] * 1e9) / 1000,
                          np.rint(cols["t_done"] * 1e9) / 1000))
        assert np.allclose(got, want, rtol=0, atol=1e-3)
        assert {e["args"]["index"] for e in slices} == set(range(buckets))
        # slices of one track never overlap (the format needs them nested)
        for tid in {e["tid"] for e in slices}:
            spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in slices if e["tid"] == tid)
            assert all(a[1] <= b[0] + 1e-3 for a, b in zip(spans, spans[1:]))

    # the report's table: steps x buckets calls per rank
    (row,) = collective_rows([run])
    total_steps = sum(len(rows["step"]) for rows in run.ranks.values())
    assert row["kind"] == "iallreduce" and row["calls"] == total_steps * buckets
    assert row["per_step"] == buckets and row["bytes"] == total_steps * _grad_nbytes()
    import argparse

    parser = argparse.ArgumentParser()
    report_command.add_arguments(parser)
    assert report_command.run(parser.parse_args([str(out)])) == 0
    text = capsys.readouterr().out
    line = next(t for t in text.splitlines() if "| iallreduce |" in t)
    assert f"| {total_steps * buckets} |" in line and "## Collectives" in text


@pytest.mark.mpi(min_size=2)
def test_blocking_ssgd_records_one_allreduce_per_step_and_no_flag_records_nothing(shared_tmp):
    from mpi4py import MPI

    run, events = _train(shared_tmp / "blocking.h5", "--algorithm", "ssgd", "--comm", "blocking",
                         "--events", "on")
    for rank, rank_events in events.items():
        cols, rows = rank_events.columns, run.ranks[rank]
        assert cols["kind"].tolist() == [ALLREDUCE] * len(rows["step"])
        assert cols["step"].tolist() == rows["step"].tolist()
        assert set(cols["bytes"].tolist()) == {_grad_nbytes()}
        assert np.all(cols["wait_s"] == 0)
        _within_steps(rows, cols)
    plain, none = _train(shared_tmp / "plain.h5", "--algorithm", "ssgd", "--comm", "blocking")
    assert none == {}
    if MPI.COMM_WORLD.Get_rank() == 0:
        import h5py

        from syncbench.analysis.collectives import collective_rows, format_collectives_md
        from syncbench.analysis.trace import trace_events

        with h5py.File(shared_tmp / "plain.h5") as f:  # packed: no /ranks/events
            assert f.attrs[schema.RANK_LAYOUT_ATTR] == schema.RANK_LAYOUT_PACKED
            assert schema.EVENTS_GROUP not in f[schema.RANKS_GROUP]
        with h5py.File(shared_tmp / "blocking.h5") as f:
            assert set(f[schema.RANKS_GROUP][schema.EVENTS_GROUP]["rank"][()].tolist()) == \
                set(run.ranks)
        # no table and no slices: a report or trace of such a file is what it was
        assert format_collectives_md(collective_rows([plain])) == ""
        assert not any(e.get("cat") == "collective" or e.get("tid", 0) > 0
                       for e in trace_events(plain)["traceEvents"])


@pytest.mark.mpi(min_size=2)
def test_asgd_records_its_window_and_counter_epochs_per_step(shared_tmp):
    """Per step: read(VERSION), the pull, read(STARTED), then the push's start, the push,
    and its count with the next ticket (``ASGD.pull`` / ``ASGD.push``); the first step may
    open with the first ticket's claim (``ASGD.done``)."""
    out = shared_tmp / "asgd.h5"
    run, events = _train(out, "--algorithm", "asgd", "--events", "on")
    pull, push, counter = KIND["rma_pull"], KIND["rma_push"], KIND["rma_counter"]
    for rank, rank_events in events.items():
        cols, rows = rank_events.columns, run.ranks[rank]
        steps = rows["step"].tolist()
        for step in steps:
            kinds = cols["kind"][cols["step"] == step].tolist()
            assert kinds[-6:] == [counter, pull, counter, counter, push, counter], (step, kinds)
            assert kinds[:-6] == ([counter] if step == steps[0] and len(kinds) == 7 else [])
        window = np.isin(cols["kind"], [pull, push])
        assert set(cols["bytes"][window].tolist()) == {_grad_nbytes()}  # the whole vector
        assert set(cols["bytes"][~window].tolist()) <= {8, 16}  # one counter, or two
        claim = np.zeros(len(window), bool)
        if len(cols["kind"][cols["step"] == steps[0]]) == 7:
            claim[int(np.flatnonzero(cols["step"] == steps[0])[0])] = True
        _within_steps(rows, {name: values[~claim] for name, values in cols.items()})


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(("algorithm", "kind", "period"),
                         [("oscars", IALLREDUCE, "2"), ("localsgd", ALLREDUCE, "4")])
def test_a_round_strategy_records_one_reduction_per_round_at_its_last_step(
        algorithm, kind, period, shared_tmp):
    out = shared_tmp / f"{algorithm}.h5"
    run, events = _train(out, "--algorithm", algorithm, "--period", period, "--events", "on")
    for rank, rank_events in events.items():
        cols, rows = rank_events.columns, run.ranks[rank]
        rounds, steps = rows["round"], rows["step"]
        last = [int(steps[rounds == r][-1]) for r in sorted(set(rounds.tolist()))]
        assert cols["step"].tolist() == last, (rounds.tolist(), cols["step"].tolist())
        assert set(cols["kind"].tolist()) == {kind}
        (size,) = set(cols["bytes"].tolist())  # the weights (Oscars: with its speeds packed)
        assert size == _grad_nbytes() if algorithm == "localsgd" else size > _grad_nbytes()


@pytest.mark.mpi(min_size=2)
@pytest.mark.parametrize(("cuda_aware", "nonblocking"), [(False, False), (True, True)],
                         ids=["staged", "direct"])
def test_the_device_communicator_records_its_calls_staged_or_direct(cuda_aware, nonblocking):
    """The GPU path's communicator (host arrays here): staged requests are recorded when
    MPI gets them, and complete through Wait and Waitall as on the CPU."""
    from mpi4py import MPI

    from syncbench.algorithms.device_buffers import DeviceCommunicator
    from syncbench.algorithms.timing import PhaseTimer
    from syncbench.kernels.backend import numpy_backend

    log = EventLog(capacity=16)
    comm = DeviceCommunicator(MPI.COMM_WORLD, PhaseTimer(), numpy_backend(), cuda_aware,
                              nonblocking, events=log)
    log.start()
    a, b, c = np.ones(5), np.ones(7), np.ones(11)
    comm.Allreduce(a)
    comm.Bcast(b)
    comm.Wait(comm.Iallreduce(c))
    comm.Waitall([comm.Iallreduce(a), comm.Iallreduce(b)])
    cols = log.columns()
    names = [schema.EVENT_KINDS[k] for k in cols["kind"]]
    assert names == ["allreduce", "bcast", "iallreduce", "iallreduce", "iallreduce"]
    assert cols["bytes"].tolist() == [a.nbytes, b.nbytes, c.nbytes, a.nbytes, b.nbytes]
    assert cols["index"].tolist() == [0, 0, 0, 1, 2]
    assert np.all(np.isfinite(cols["t_done"])) and np.all(cols["t_done"] >= cols["t_post"])
    assert np.all(c == MPI.COMM_WORLD.Get_size())  # the reductions still reduced


@pytest.mark.mpi(min_size=2)
def test_odsgd_reductions_complete_in_the_next_step_as_its_one_step_delay_says(shared_tmp):
    warmup = 2
    out = shared_tmp / "odsgd.h5"
    run, events = _train(out, "--algorithm", "odsgd", "--warmup-steps", str(warmup),
                         "--events", "on")
    for rank, rank_events in events.items():
        cols, rows = rank_events.columns, run.ranks[rank]
        steps = rows["step"].tolist()
        starts = dict(zip(steps, rows["t_start"].tolist()))
        kinds = dict(zip(cols["step"].tolist(), cols["kind"].tolist()))  # one call a step
        assert len(cols["step"]) == len(steps) == len(kinds)
        assert all(kinds[s] == (ALLREDUCE if s < warmup else IALLREDUCE) for s in steps)
        for step, kind, done in zip(cols["step"], cols["kind"], cols["t_done"]):
            if kind == IALLREDUCE and int(step) + 1 in starts:  # waited on by the next step
                assert starts[int(step) + 1] <= done
                assert int(step) + 2 not in starts or done <= starts[int(step) + 2]
