"""The phase timer's CPU times: the compute phase (``cpu_compute``), the comm and wait
phases (``cpu_sync``) and the whole step (``cpu_step``)."""

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


def test_sync_cpu_time_is_the_comm_and_wait_phases_and_the_step_holds_every_phase():
    """A comm nested in compute spins 30 ms, a wait spins 20 ms and sleeps 50 ms (a
    blocked wait), an update spins 10 ms and 15 ms pass between phases: the sync CPU is
    50 ms (the nested comm counted once, the sleep not at all), the step's CPU, its
    phases', 80 ms."""
    timer = PhaseTimer()
    timer.reset()
    with timer.phase("compute"):
        _spin(0.02)
        with timer.phase("comm"):
            _spin(0.03)
    with timer.phase("wait"):
        _spin(0.02)
        time.sleep(0.05)
    _spin(0.015)  # between phases: no phase's
    with timer.phase("update"):
        _spin(0.01)
    assert timer.compute_cpu_s == pytest.approx(0.02, abs=0.008)
    assert timer.sync_cpu_s == pytest.approx(0.05, abs=0.008)
    assert timer.step_cpu_s == pytest.approx(0.08, abs=0.012)
    timer.reset()
    assert timer.sync_cpu_s == 0.0 and timer.step_cpu_s == 0.0


def test_a_freeze_brought_on_by_a_cpu_clock_read_falls_inside_a_phase(monkeypatch):
    """At a CPU quota the kernel checks the quota to answer a read of the thread's CPU
    clock and may freeze the thread on it. Each read here is followed by 10 ms off the
    CPU: all eight reads' 80 ms fall inside the step's phases (their walls add up to the
    step's), none between them, and none in any phase's CPU time."""
    from syncbench.algorithms import timing

    real = time.thread_time

    def frozen_on_read() -> float:
        cpu = real()
        time.sleep(0.01)
        return cpu

    monkeypatch.setattr(timing.time, "thread_time", frozen_on_read)
    timer = PhaseTimer()
    timer.reset()
    begin = time.monotonic()
    with timer.phase("data"):
        pass
    with timer.phase("compute"), timer.phase("comm"):  # a poll nested in compute
        pass
    with timer.phase("update"):
        pass
    wall = time.monotonic() - begin
    assert wall >= 0.08
    assert sum(timer.totals.values()) == pytest.approx(wall, abs=0.002)
    assert timer.step_cpu_s < 0.005


def test_a_recorded_step_keeps_its_compute_cpu_time_and_older_rows_read_as_unmeasured():
    import math

    import numpy as np

    from syncbench.algorithms.base import StepStats
    from syncbench.analysis import schema
    from syncbench.bench.train.recorder import StepRecorder

    recorder = StepRecorder()
    recorder.extend({name: np.zeros(2, dtype=dtype) for name, dtype in schema.RANK_COLUMNS.items()
                     if not name.startswith("cpu_")})  # rows saved before the columns
    recorder.append(2, 0.5, dict.fromkeys(schema.PHASES, 0.01), StepStats(loss=1.0, samples=8),
                    0.004, 0.002, 0.007)
    for name, value in (("cpu_compute", 0.004), ("cpu_sync", 0.002), ("cpu_step", 0.007)):
        cpu = recorder.columns()[name]
        assert math.isnan(cpu[0]) and math.isnan(cpu[1]) and cpu[2] == value
