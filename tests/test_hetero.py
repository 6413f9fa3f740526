"""Heterogeneity emulation: slowdown specs, schedules, and the driver following them.

Serial tests; the end-to-end ones launch their own ``mpiexec`` (bounded by
subprocess timeouts) and are skipped when pytest itself runs under mpiexec.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
from helpers import run_mpi

from syncbench.analysis.runfile import read_run
from syncbench.bench.hetero import (
    Slowdown,
    SlowdownChange,
    factor_at,
    make_slowdown,
    parse_slowdown,
    parse_slowdown_schedule,
    rank_timeline,
)

UNDER_MPI = any(v in os.environ for v in ("PMI_RANK", "PMI_SIZE", "OMPI_COMM_WORLD_SIZE"))
SMALL = ["--dataset", "synthetic", "--synthetic-samples", "1024", "--batch-size", "16",
         "--progress", "never"]


# -- --slowdown -----------------------------------------------------------------
def test_parse_slowdown():
    assert parse_slowdown(None, 3) == [1.0, 1.0, 1.0]
    assert parse_slowdown("", 2) == [1.0, 1.0]
    assert parse_slowdown("1,1,1,4", 4) == [1.0, 1.0, 1.0, 4.0]
    assert parse_slowdown(" 1.5, 2", 2) == [1.5, 2.0]


def _one_line_error(fn, *args, match):
    with pytest.raises(ValueError, match=match) as info:
        fn(*args)
    message = str(info.value)
    assert "\n" not in message and message.startswith("--slowdown")
    return message


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("1,2,3", "has 3 factors but the job has 2 ranks"),
        ("1", "has 1 factors but the job has 2 ranks"),
        ("1,0.5", "every factor must be >= 1, got 0.5"),
        ("-2,1", "every factor must be >= 1, got -2"),
        ("1,abc", "factor 'abc' is not a number"),
        ("1,", "factor '' is not a number"),
        ("1,nan", "every factor must be >= 1"),
        ("1,inf", "every factor must be >= 1"),
    ],
)
def test_bad_slowdown_specs_are_one_line_errors(spec, match):
    _one_line_error(parse_slowdown, spec, 2, match=match)


# -- --slowdown-schedule ----------------------------------------------------------
def test_parse_slowdown_schedule():
    assert parse_slowdown_schedule(None, 4) == []
    assert parse_slowdown_schedule("  ", 4) == []
    assert parse_slowdown_schedule("20s:3=1,2=3", 4) == [SlowdownChange(20.0, {3: 1.0, 2: 3.0})]
    changes = parse_slowdown_schedule("40s:0=2; 500ms:1=1.5;10:3=4", 4)
    assert [c.at_s for c in changes] == [0.5, 10.0, 40.0]  # sorted by time
    assert changes[0].factors == {1: 1.5} and changes[2].factors == {0: 2.0}


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("20s", "expected TIME:RANK=FACTOR"),
        ("20s:", "expected TIME:RANK=FACTOR"),
        ("soon:1=2", "time 'soon' is not like 20s or 500ms"),
        ("-5s:1=2", "time '-5s' must be >= 0"),
        ("20s:4=2", "rank 4 out of range 0..3"),
        ("20s:-1=2", "rank -1 out of range 0..3"),
        ("20s:x=2", "rank 'x' is not an integer"),
        ("20s:1", "expected RANK=FACTOR, got '1'"),
        ("20s:1=0.5", "every factor must be >= 1, got 0.5"),
        ("20s:1=-3", "every factor must be >= 1, got -3"),
        ("20s:1=fast", "factor 'fast' is not a number"),
        ("20s:1=2,1=3", "rank 1 set twice at 20s"),
        ("20s:1=2;;", "expected TIME:RANK=FACTOR"),
    ],
)
def test_bad_slowdown_schedules_are_one_line_errors(spec, match):
    message = _one_line_error(parse_slowdown_schedule, spec, 4, match=match)
    assert message.startswith("--slowdown-schedule")


def test_rank_timeline_and_factor_at():
    changes = parse_slowdown_schedule("10s:3=1,2=3;20s:2=1", 4)
    assert rank_timeline(4.0, changes, 3) == [(0.0, 4.0), (10.0, 1.0)]
    line = rank_timeline(1.0, changes, 2)
    assert line == [(0.0, 1.0), (10.0, 3.0), (20.0, 1.0)]
    assert [factor_at(line, t) for t in (0, 9.99, 10, 15, 20, 99)] == [1, 1, 3, 3, 1, 1]
    assert rank_timeline(2.0, changes, 0) == [(0.0, 2.0)]


def test_make_slowdown_only_for_slowed_ranks():
    changes = parse_slowdown_schedule("1s:2=3", 4)
    factors = parse_slowdown("1,1,1,4", 4)
    assert make_slowdown(factors, changes, 0) is None
    assert make_slowdown(factors, changes, 2).timeline == [(0.0, 1.0), (1.0, 3.0)]
    assert make_slowdown(factors, changes, 3).factor == 4.0


def test_slowdown_follows_its_clock():
    now = [100.0]
    slow = Slowdown(timeline=[(0.0, 1.0), (5.0, 3.0), (8.0, 1.0)], clock=lambda: now[0])
    slow.start()
    assert slow(0.01) == 0.0 and slow.factor == 1.0  # factor 1: no sleep
    now[0] = 105.0
    slept = slow(0.002)  # (3 - 1) * 2 ms
    assert slow.factor == 3.0 and 0.004 <= slept < 0.1
    now[0] = 108.5
    assert slow(0.01) == 0.0 and slow.factor == 1.0


def test_constant_slowdown_sleeps_f_minus_one_times_compute():
    started = time.perf_counter()
    slept = Slowdown(4.0)(0.005)
    assert 0.015 <= slept <= time.perf_counter() - started < 0.5


# -- end to end: the driver and the algorithms -----------------------------------
needs_mpiexec = pytest.mark.skipif(UNDER_MPI, reason="launches its own mpiexec")


@needs_mpiexec
@pytest.mark.parametrize("algorithm", ["oscars", "localsgd"])
def test_driver_runs_with_a_slowdown_schedule(tmp_path, algorithm):
    out = tmp_path / "run.h5"
    proc = run_mpi(2, "train", *SMALL, "--algorithm", algorithm, "--epochs", "2",
                   "--eval-every", "0.5", "--slowdown", "1,3",
                   "--slowdown-schedule", "0.2s:1=1,0=3", "--out", str(out), timeout=90)
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    budget = 2 * (1024 // 2 // 16) * 16 * 2  # epochs * steps_per_epoch * batch * ranks
    samples = sum(int(rows["samples"].sum()) for rows in run.ranks.values())
    assert samples == budget  # equal work: exactly the sample budget
    assert run.eval["samples_seen"][-1] == budget
    assert np.all(np.diff(run.eval["samples_seen"]) > 0)
    assert run.rank_attrs[1]["slowdown"] == 3.0
    assert run.ranks[1]["t_delay"][:3].sum() > 0  # rank 1 was slowed down at first
    for rows in run.ranks.values():
        assert rows["round"][-1] >= 1 and np.all(rows["local_steps"] >= 1)
        assert np.all(np.diff(rows["round"]) >= 0)
    rounds = {int(rows["round"][-1]) for rows in run.ranks.values()}
    assert len(rounds) == 1  # every rank ended in the same round


@needs_mpiexec
def test_bad_slowdown_schedule_fails_before_training():
    started = time.monotonic()
    proc = run_mpi(2, "train", *SMALL, "--slowdown-schedule", "5s:2=3", timeout=60)
    assert proc.returncode == 2 and time.monotonic() - started < 30
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("syncbench:")]
    assert len(errors) == 1 and "rank 2 out of range 0..1" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
