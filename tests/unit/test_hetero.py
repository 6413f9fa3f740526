"""Heterogeneity emulation: slowdown specs, schedules, and the driver following them.

Serial tests; the end-to-end ones launch their own ``mpiexec`` (bounded by
subprocess timeouts) and are skipped when pytest itself runs under mpiexec.

Split off this module: ``tests/mpi_inproc/test_hetero_mpi.py`` (its in-process MPI tests)
and ``tests/e2e/test_hetero_e2e.py`` (its tests that launch a process or start MPI).
"""

from __future__ import annotations

import math
import time

import numpy as np
import pytest

from syncbench.bench.train.slowdown import (
    REFERENCE_WINDOW,
    ModelWork,
    Slowdown,
    SlowdownChange,
    factor_at,
    make_slowdown,
    parse_slowdown,
    parse_slowdown_schedule,
    rank_timeline,
    resolve_mode,
)
from syncbench.kernels.zoo import build_model


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


# -- --slowdown-mode ---------------------------------------------------------------
def test_auto_mode_works_when_ranks_share_a_node_and_sleeps_only_when_alone():
    assert resolve_mode("auto", 2) == "work"
    assert resolve_mode("auto", 1) == "sleep"
    for mode in ("work", "spin", "sleep"):
        assert resolve_mode(mode, 1) == resolve_mode(mode, 4) == mode
    with pytest.raises(ValueError, match="--slowdown-mode must be one of"):
        resolve_mode("nap", 1)


@pytest.fixture
def fake_clock(monkeypatch):
    """``time.perf_counter`` stands still except when a fake wait moves it."""
    import syncbench.bench.train.slowdown as slowdown

    now = [1000.0]
    monkeypatch.setattr(slowdown.time, "perf_counter", lambda: now[0])
    return now


def test_reference_is_a_running_median_not_one_steps_noise(fake_clock):
    def wait(deadline):
        fake_clock[0] = deadline

    slow = Slowdown(4.0, mode="work", work=wait)
    for _ in range(9):
        slow(0.002)
    spent = slow(0.050)  # one noisy step: 25x the usual compute
    assert slow.reference() == pytest.approx(0.002)
    assert spent == pytest.approx(0.006)  # 3 x the median, not 3 x 50 ms
    assert slow.mean_reference == pytest.approx(0.002)
    window = Slowdown(2.0, mode="work", work=wait)
    for _ in range(REFERENCE_WINDOW):
        window(0.001)
    for _ in range(REFERENCE_WINDOW // 2 + 1):
        window(0.003)
    assert window.reference() == pytest.approx(0.003)  # old steps leave the window


def test_overshoot_is_carried_as_debt(fake_clock):
    late = 0.004

    def overshooting(deadline):  # a wait that always ends 4 ms late
        fake_clock[0] = deadline + late

    slow = Slowdown(2.0, mode="work", work=overshooting)
    spent = [slow(0.010) for _ in range(8)]
    assert spent[0] == pytest.approx(0.010 + late) and slow.debt == pytest.approx(late)
    assert spent[1:] == pytest.approx([0.010] * 7)  # each step pays the previous debt
    assert sum(spent) == pytest.approx(8 * 0.010 + late)  # mean delay as asked for


def test_factor_one_or_a_large_debt_injects_nothing():
    slow = Slowdown(timeline=[(0.0, 1.0)], mode="spin")
    assert slow(0.01) == 0.0 and math.isnan(slow.mean_reference)
    slow = Slowdown(2.0, mode="spin")
    slow.debt = 0.05  # a long preemption across the last deadline
    assert slow(0.01) == 0.0 and slow.debt == 0.0  # not carried beyond the next step
    assert slow(0.01) >= 0.01


@pytest.mark.parametrize("mode", ["spin", "work", "sleep"])
def test_spin_and_work_occupy_the_core_sleep_frees_it(mode):
    model = build_model("mlp", (1, 28, 28), 10)
    work = ModelWork(model, 32) if mode == "work" else None
    slow = Slowdown(4.0, mode=mode, work=work)
    cpu, spent = time.process_time(), 0.0
    for _ in range(5):
        spent += slow(0.010)
    cpu = time.process_time() - cpu
    assert spent >= 5 * 0.030 * 0.9
    if mode == "sleep":
        assert cpu < 0.1 * spent
    else:
        assert cpu > 0.2 * spent  # loose: the machine may be shared
    if mode == "work":
        assert work.passes >= 1  # whole forward/backward passes, not just a clock loop


@pytest.mark.parametrize("mode", ["spin", "work", "sleep"])
def test_the_delay_keeps_driving_mpi_progress(mode):
    work = ModelWork(build_model("mlp", (1, 28, 28), 10), 32) if mode == "work" else None
    slow = Slowdown(4.0, mode=mode, work=work)
    calls = []
    slow.progress = lambda: calls.append(time.perf_counter())
    started = time.perf_counter()
    slow(0.005)  # 15 ms of delay
    assert len(calls) >= 3, calls  # spin/sleep: every 0.2 ms; work: between layers
    assert all(started <= t <= started + 0.5 for t in calls)


def test_model_work_leaves_the_training_state_alone():
    model = build_model("lenet", (1, 28, 28), 10, seed=1)
    model.grads[...] = 0.5
    params, grads = model.params.copy(), model.grads.copy()
    shadow = build_model("lenet", (1, 28, 28), 10, seed=1)
    work = ModelWork(shadow, 16)
    rng_state = np.random.get_state()[1].copy()
    work(time.perf_counter() + 0.05)
    assert work.passes >= 1
    assert not np.shares_memory(shadow.params, model.params)
    assert not np.shares_memory(shadow.grads, model.grads)
    np.testing.assert_array_equal(model.params, params)
    np.testing.assert_array_equal(model.grads, grads)
    np.testing.assert_array_equal(np.random.get_state()[1], rng_state)


def test_model_work_stops_between_layers_at_the_deadline():
    work = ModelWork(build_model("lenet", (1, 28, 28), 10), 64)
    started = time.perf_counter()
    work(started + 0.001)  # far shorter than one lenet pass at batch 64
    assert time.perf_counter() - started < 0.05


def test_make_slowdown_builds_the_work_only_for_slowed_ranks():
    built = []

    def factory():
        built.append(1)
        return lambda deadline: None

    factors = parse_slowdown("1,4", 2)
    assert make_slowdown(factors, [], 0, "work", factory) is None and not built
    slow = make_slowdown(factors, [], 1, "work", factory)
    assert slow.mode == "work" and built == [1]
    assert make_slowdown(factors, [], 1, "spin").mode == "spin"
    with pytest.raises(ValueError, match="needs a model"):
        make_slowdown(factors, [], 1, "work")
