"""``python -m syncbench.bench.micro.quota_collective``'s arithmetic: a node's freezes from
its throttled-time reads, and the freezes that fall in a collective, in a rank's compute
and in its wait, on the host's clock (the run on a cluster:
tests/e2e/test_cluster.py::test_a_collective_at_a_quota_sees_the_slow_nodes_freezes)."""

from __future__ import annotations

import math

import pytest

from syncbench.bench.micro import quota_collective as qc


def test_an_increase_is_a_freeze_ending_between_the_two_reads():
    # reads every ms: the count moves by 4 ms between the reads at 10 and 11 ms, and by
    # 1 ms between 20 and 21; the first entry is where the count started
    reads = [(0.000, 0.001, 7.0), (0.010, 0.011, 7.004), (0.020, 0.021, 7.005)]
    spans = qc.freezes(reads)
    assert len(spans) == 2
    (a, b), (c, d) = spans
    assert b == pytest.approx(0.0105) and b - a == pytest.approx(0.004)
    assert d == pytest.approx(0.0205) and d - c == pytest.approx(0.001)
    assert qc.freezes(reads[:1]) == []


def test_frozen_within_counts_only_the_overlap():
    spans = [(1.0, 2.0), (3.0, 5.0)]
    assert qc.frozen_within(spans, 1.5, 4.0) == pytest.approx(1.5)
    assert qc.frozen_within(spans, 2.0, 3.0) == 0.0
    assert qc.frozen_within([], 0.0, 9.0) == 0.0


def _stamps(steps: list[list[tuple[float, float, float]]], b2b_s: float) -> dict:
    """Two ranks' stamps: ``steps[k]`` rank k's (start, post, done) per step; back to back
    ``b2b_s`` long."""
    ranks = []
    for k, rows in enumerate(steps):
        b2b = [(10.0 + j, 10.0 + j, 10.0 + j + b2b_s) for j in range(len(rows))]
        ranks.append({"node": f"n{k + 1}", "back_to_back": b2b, "steps": rows})
    return {"bytes": 1024, "ranks": ranks}


def test_a_freeze_after_the_last_post_is_the_collectives_and_one_before_is_the_waits():
    """Rank 1 (node n2) posts last in every step; node n1, which posted first, is frozen
    from before the last post to 2 ms after it in step 1: 1 ms of that falls in its wait
    and 2 in the collective, which lasts 5 ms against 3 back to back. Node n2's clock is
    1000 s ahead of the host's, and its stamps are taken back to the host's clock."""
    off = 1000.0
    rank0 = [(0.0, 0.010, 0.015), (0.020, 0.030, 0.035 + 0.002), (0.040, 0.050, 0.055)]
    rank1 = [(0.0 + off, 0.012 + off, 0.015 + off), (0.020 + off, 0.032 + off, 0.037 + off),
             (0.040 + off, 0.052 + off, 0.055 + off)]
    stamps = _stamps([rank0, rank1], 0.003)
    frozen = {"n1": [(0.031, 0.034)], "n2": []}
    figures = qc.join(stamps, {"n1": 0.0, "n2": off}, frozen, skip=0)
    assert figures["steps"] == 3 and figures["nodes"] == ["n1", "n2"]
    assert figures["back_to_back_ms"]["median"] == pytest.approx(3.0)
    assert figures["after_step_ms"]["median"] == pytest.approx(3.0)
    assert figures["after_step_ms"]["p90"] > 4.0  # step 1: 5 ms
    assert figures["steps_frozen_inside"] == pytest.approx(1 / 3)
    assert figures["back_to_back_frozen_inside"] == 0.0  # n1's freeze is at 31-34 ms
    assert figures["most_frozen_inside_mean_ms"] == pytest.approx(2.0 / 3)
    per = figures["frozen_per_rank_step_ms"]
    # n1's 1 ms between its post (30 ms) and the last (32 ms): per rank and step 1/6 ms
    assert per["wait_for_last_post"] == pytest.approx(1.0 / 6)
    assert per["after_last_post"] == pytest.approx(2.0 / 6)
    assert per["compute"] == 0.0
    less = figures["after_step_less_most_frozen_ms"]
    assert less["median"] == pytest.approx(3.0) and less["p90"] < 3.5
    assert figures["frozen_share_per_node"]["n2"] == 0.0
    assert figures["frozen_share_per_node"]["n1"] == pytest.approx(3.0 / 55)
    text = qc.report(figures)
    assert "33% of steps" in text and "n1, n2" in text


def test_the_first_steps_are_left_out():
    rows = [(0.01 * j, 0.01 * j + 0.005, 0.01 * j + 0.008) for j in range(5)]
    figures = qc.join(_stamps([rows, rows], 0.003), {}, {"n1": [(0.0, 0.0049)]}, skip=2)
    assert figures["steps"] == 3
    assert figures["frozen_per_rank_step_ms"]["compute"] == 0.0  # the freeze was in step 0
    # back to back at 10 + j s, 3 ms each: a freeze across the third is counted there
    frozen = {"n2": [(12.001, 12.0025)]}
    again = qc.join(_stamps([rows, rows], 0.003), {}, frozen, skip=2)
    assert again["back_to_back_frozen_inside"] == pytest.approx(1 / 3)


@pytest.mark.parametrize("flags,named", [
    (["--ranks", "1"], "--ranks"),
    (["--ranks", "x"], "--ranks"),
    (["--steps", "0"], "--steps"),
    (["--steps", "5", "--skip", "5"], "--skip"),
    (["--sample-ms", "0"], "--sample-ms"),
    (["--sample-ms", "nan"], "--sample-ms"),
    (["--spin-ms", "-1", "--bytes", "64"], "--spin-ms"),
    (["--spin-ms", "2"], "--bytes"),
    (["--bytes", "2"], "--bytes"),
    (["--model", "nope"], "--model"),
    (["--bogus"], "unknown arguments"),
])
def test_bad_input_is_refused_naming_the_flag(flags, named):
    with pytest.raises(ValueError, match=named.replace("-", r"\-")):
        qc.parse(flags)


def test_the_defaults_parse():
    args = qc.parse([])
    assert (args.ranks, args.model, args.steps, args.skip) == (4, "lenet", 150, 3)
    assert math.isclose(args.sample_ms, 0.5) and args.spin_ms is None
