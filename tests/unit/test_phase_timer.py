"""The phase timer's CPU time of the compute phase (``cpu_compute``)."""

from __future__ import annotations

import time

import pytest

from syncbench.algorithms.timing import PhaseTimer


def _spin(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_compute_cpu_time_leaves_out_sleep_and_the_phases_nested_in_it():
    """A compute phase that spins 40 ms, sleeps 60 ms and spins 30 ms inside a nested
    ``comm`` (a poll between layers) has 100 ms or more of wall and 40 ms of CPU: the
    sleep (what a quota's freeze is to the thread) and the nested phase's CPU are not in
    it; a new step starts from zero."""
    timer = PhaseTimer()
    timer.reset()
    with timer.phase("compute"):
        _spin(0.04)
        time.sleep(0.06)
        with timer.phase("comm"):
            _spin(0.03)
    assert timer.totals["compute"] >= 0.1
    assert timer.compute_cpu_s == pytest.approx(0.04, abs=0.01)
    with timer.phase("update"):
        _spin(0.01)
    assert timer.compute_cpu_s == pytest.approx(0.04, abs=0.01)
    timer.reset()
    assert timer.compute_cpu_s == 0.0
    with timer.phase("data"), timer.phase("compute"):
        _spin(0.02)
    assert timer.compute_cpu_s == pytest.approx(0.02, abs=0.01)


def test_a_recorded_step_keeps_its_compute_cpu_time_and_older_rows_read_as_unmeasured():
    import math

    import numpy as np

    from syncbench.algorithms.base import StepStats
    from syncbench.analysis import schema
    from syncbench.bench.train.recorder import StepRecorder

    recorder = StepRecorder()
    recorder.extend({name: np.zeros(2, dtype=dtype) for name, dtype in schema.RANK_COLUMNS.items()
                     if name != "cpu_compute"})  # rows saved before the column
    recorder.append(2, 0.5, dict.fromkeys(schema.PHASES, 0.01), StepStats(loss=1.0, samples=8),
                    0.004)
    cpu = recorder.columns()["cpu_compute"]
    assert math.isnan(cpu[0]) and math.isnan(cpu[1]) and cpu[2] == 0.004
