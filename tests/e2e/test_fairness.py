"""Fairness metrics of a heterogeneous run, on hand-built per-step rows (serial)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from syncbench.analysis.fairness import (
    delay_intervals,
    interference_ratio,
    realised_factor,
    realised_factors,
    throughput_ceiling,
)
from syncbench.analysis.runfile import Run
from syncbench.analysis.schema import RANK_COLUMNS


def _rows(t_start, compute, delay=None, data=None, comm=None):
    n = len(t_start)
    rows = {name: np.zeros(n, dtype=dtype) for name, dtype in RANK_COLUMNS.items()}
    rows["step"] = np.arange(n)
    rows["t_start"] = np.asarray(t_start, dtype=float)
    rows["t_compute"] = np.asarray(compute, dtype=float)
    for name, value in (("t_delay", delay), ("t_data", data), ("t_comm", comm)):
        if value is not None:
            rows[name] = np.asarray(value, dtype=float)
    return rows


def _run(ranks, factors, algorithm="oscars", **attrs):
    return Run(path="mem", attrs={"algorithm": algorithm, **attrs},
               ranks=dict(enumerate(ranks)),
               rank_attrs={r: {"slowdown": f} for r, f in enumerate(factors)},
               eval={}, summary={})


def _oscars_like(fast_compute_in_delay: float, slow_factor: float = 4.0):
    """Rank 1 computes 1 s then delays (f-1) s; rank 0 takes f steps of 1 s meanwhile,
    the first while rank 1 computes, the others while it is in its delay."""
    steps = 6
    slow_start = np.arange(steps) * slow_factor
    slow = _rows(slow_start, np.ones(steps), np.full(steps, slow_factor - 1))
    starts, computes = [], []
    for s in slow_start:
        t = s
        for k in range(int(slow_factor)):
            c = 1.0 if k == 0 else fast_compute_in_delay
            starts.append(t)
            computes.append(c)
            t += 1.0  # the step slot stays 1 s (the rest is update/idle)
    fast = _rows(starts, computes)
    return _run([fast, slow], [1.0, slow_factor])


def test_realised_factor_is_busy_over_normal_compute():
    fast0 = _rows([0, 1, 2, 3], [1.0, 1.0, 1.0, 1.0])
    fast1 = _rows([0, 1, 2, 3], [2.0, 2.0, 2.0, 2.0])
    fast2 = _rows([0, 1, 2, 3], [3.0, 3.0, 3.0, 3.0])
    slow = _rows([0, 5, 10], [2.0, 2.0, 2.0], [4.0, 6.0, 8.0])  # busy 6, 8, 10 -> mean 8
    run = _run([fast0, fast1, fast2, slow], [1, 1, 1, 4])
    assert realised_factor(run) == pytest.approx(8.0 / 2.0)  # median of 1, 2, 3 is 2
    assert realised_factors(run) == {3: pytest.approx(4.0)}


def test_realised_factor_skips_warmup_and_picks_the_slowest_rank():
    fast = _rows([0, 1, 2], [10.0, 1.0, 1.0])  # first step is warm-up
    mid = _rows([0, 1, 2], [10.0, 1.0, 1.0], [0.0, 1.0, 1.0])
    slow = _rows([0, 1, 2], [10.0, 1.0, 1.0], [0.0, 3.0, 3.0])
    run = _run([fast, mid, slow], [1, 2, 4], warmup_steps=1)
    assert realised_factors(run) == {1: pytest.approx(2.0), 2: pytest.approx(4.0)}
    assert realised_factor(run) == pytest.approx(4.0)


def test_median_realised_factor_ignores_preemption_noise():
    # 1 s of compute, one step in four preempted for 8 s on every rank
    noise = np.array([0.0, 0.0, 0.0, 8.0] * 5)
    fast = _rows(np.arange(20), 1.0 + noise)
    slow = _rows(np.arange(20), 1.0 + noise, np.full(20, 3.0))  # delay: 3 x the median
    run = _run([fast, slow], [1, 4])
    assert realised_factor(run) == pytest.approx((4 + 2) / (1 + 2))  # mean: (f*c + n)/(c + n)
    assert realised_factor(run, statistic="median") == pytest.approx(4.0)


def test_realised_factor_nan_without_a_slowed_or_an_unslowed_rank():
    rows = _rows([0, 1], [1.0, 1.0])
    assert math.isnan(realised_factor(_run([rows, rows], [1, 1])))
    assert math.isnan(realised_factor(_run([rows, rows], [2, 2])))


def test_delay_intervals_follow_data_and_compute_and_merge():
    a = _rows([0.0, 10.0], [1.0, 1.0], [2.0, 2.0], data=[0.5, 0.5])  # [1.5,3.5) [11.5,13.5)
    b = _rows([2.0], [1.0], [3.0])  # [3, 6): overlaps a's first interval
    fast = _rows([0.0], [1.0])
    spans = delay_intervals(_run([fast, a, b], [1, 4, 4]))
    np.testing.assert_allclose(spans, [[1.5, 6.0], [11.5, 13.5]])


def test_delay_intervals_place_asgd_pull_before_compute():
    slow = _rows([0.0], [1.0], [3.0], data=[0.5], comm=[1.0])  # pull 0.5 s, push 0.5 s
    spans = delay_intervals(_run([_rows([0.0], [1.0]), slow], [1, 4], algorithm="asgd"))
    np.testing.assert_allclose(spans, [[2.0, 5.0]])


@pytest.mark.parametrize("speedup", [1.0, 0.9, 0.8])
def test_interference_ratio_sees_faster_compute_during_the_delay(speedup):
    assert interference_ratio(_oscars_like(speedup)) == pytest.approx(speedup)


def test_interference_ratio_nan_when_fast_ranks_never_compute_during_a_delay():
    # lock-step SSGD: both ranks compute together, the fast one then waits
    fast = _rows([0.0, 4.0, 8.0], [1.0, 1.0, 1.0])
    slow = _rows([0.0, 4.0, 8.0], [1.0, 1.0, 1.0], [3.0, 3.0, 3.0])
    assert math.isnan(interference_ratio(_run([fast, slow], [1, 4], algorithm="ssgd")))
    assert math.isnan(interference_ratio(_run([fast, fast], [1, 1])))
    # one fast step of 30 misplaced by noise into a delay is not a measurement
    starts = np.arange(30) * 4.0
    fast = _rows(np.r_[starts[:-1], starts[-1] + 2.0], np.ones(30))
    slow = _rows(starts, np.ones(30), np.full(30, 3.0))
    run = _run([fast, slow], [1, 4], algorithm="ssgd")
    assert math.isnan(interference_ratio(run))
    assert interference_ratio(run, min_share=0.0) == pytest.approx(1.0)


def test_throughput_ceiling():
    assert throughput_ceiling([1, 4]) == pytest.approx(0.625)
    assert throughput_ceiling([1, 1, 1, 4]) == pytest.approx(0.8125)
    assert throughput_ceiling({0: 1.0, 1: 1.0}) == 1.0
    assert math.isnan(throughput_ceiling([]))
    with pytest.raises(ValueError, match="finite and > 0"):
        throughput_ceiling([1, 0])


def _round_based(first_step_compute: float, local_steps: int):
    """Rank 1 takes 2 steps per round (1 s compute + 3 s delay each); rank 0 takes 8 steps
    of 1 s per round, two starting while rank 1 computes (the round's first, and the fifth),
    the others inside its delays. The first step of a round computes ``first_step_compute``."""
    rounds = 5
    slow_start = np.arange(2 * rounds) * 4.0
    slow = _rows(slow_start, np.ones(2 * rounds), np.full(2 * rounds, 3.0))
    slow["round"] = np.repeat(np.arange(rounds), 2)
    slow["local_steps"] = np.full(2 * rounds, local_steps and 2)
    starts = np.arange(8 * rounds) * 1.0
    computes = np.where(np.arange(8 * rounds) % 8 == 0, first_step_compute, 1.0)
    fast = _rows(starts, computes)
    fast["round"] = np.repeat(np.arange(rounds), 8)
    fast["local_steps"] = np.full(8 * rounds, local_steps)
    return _run([fast, slow], [1.0, 4.0], algorithm="oscars")


def test_interference_ratio_drops_the_first_step_of_every_round():
    # the slow first step after an averaging is no interference: the ratio stays 1
    assert interference_ratio(_round_based(1.3, local_steps=8)) == pytest.approx(1.0)
    # step-synchronous rows (no rounds) keep every step: the confound shows
    assert interference_ratio(_round_based(1.3, local_steps=0)) == pytest.approx(1.0 / 1.15)


def test_phase_placement_follows_the_strategys_step_order():
    from syncbench.analysis import schema

    slow = _rows([0.0], [1.0], [3.0], data=[0.5])
    slow["t_update"] = np.asarray([0.25])
    run = _run([_rows([0.0], [1.0]), slow], [1, 4], algorithm="custom")
    np.testing.assert_allclose(delay_intervals(run), [[1.5, 4.5]])  # default: update last
    traits = schema.StrategyTraits(step_order=("data", "update", "compute", "delay", "comm",
                                               "wait"))
    run.attrs[schema.TRAITS_ATTR] = traits.to_json()  # the run file's own, not a table
    np.testing.assert_allclose(delay_intervals(run), [[1.75, 4.75]])


def test_rank_table_realised_factor_is_the_fairness_definition():
    from syncbench.analysis.run_metrics import rank_table
    from syncbench.bench.train.driver import realised_into

    fast = _rows(np.arange(5) * 4.0, np.full(5, 2.0))
    # own (compute + delay) / own compute would read 4; a preempted step adds noise
    slow = _rows(np.arange(5) * 4.0, [1.0, 1.0, 1.0, 1.0, 9.0], np.full(5, 3.0))
    run = _run([fast, slow], [1.0, 4.0], algorithm="ssgd")
    run.rank_attrs[1]["slowdown_realised"] = 4.0  # a stored value of another definition
    run.summary["wall_s"] = 20.0
    table = rank_table(run)
    assert table[1]["slowdown_realised"] == pytest.approx(2.0)  # median 4 s over 2 s
    assert table[0]["slowdown_realised"] == 1.0
    attrs = {r: dict(a) for r, a in run.rank_attrs.items()}
    realised_into(attrs, run.ranks, run.attrs)  # what the driver writes
    assert attrs[1]["slowdown_realised"] == pytest.approx(2.0)
