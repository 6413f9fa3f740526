"""``syncbench report --compare A B``: the U test, the sets of runs, flags and bad input.

The U statistics and p-values are checked against cases computed by hand and
against values of scipy.stats.mannwhitneyu (scipy 1.17.1, computed once and
written here: scipy is no dependency). Two results files built from the
golden scenario's ``results.json``, each run repeated three times with its
figures jittered by under 1%, are compared with one label's samples/s scaled
by 0.7 in B: exactly that label's samples/s rows are flagged; a set compared
with itself flags nothing; the golden run files' 2 repeats are "n too small".
Pairing by what the run files record, "n/a" for a missing target and the exit
status when nothing pairs are checked on real runs in test_report_inputs.py.

Split off this module: ``tests/e2e/test_compare_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest

from syncbench.analysis import compare

GOLDEN = Path("/work/golden/scen")
GOLDEN_RESULTS = GOLDEN / "results.json"
needs_golden = pytest.mark.skipif(not GOLDEN_RESULTS.is_file(),
                                  reason="the golden scenario's results are not here")

# scipy.stats.mannwhitneyu(b, a, alternative="two-sided", method=...) (statistic, pvalue)
SCIPY_25_A = [12.04, 7.44, 10.42, 9.43, 9.55, 9.78, 7.98, 9.77, 9.13, 13.32, 10.23, 9.65,
              9.72, 9.33, 8.94, 9.61, 10.48, 9.76, 10.96, 9.8, 10.02, 11.55, 10.55, 9.49,
              9.82]
SCIPY_25_B = [11.34, 12.74, 10.53, 10.56, 11.8, 9.91, 10.51, 11.68, 11.38, 10.89, 11.47,
              7.97, 11.82, 9.84, 9.13, 11.08, 11.5, 10.36, 9.72, 10.83, 10.75, 12.21, 11.55,
              10.99, 11.91]


# ---------------------------------------------------------------- the U test


@pytest.mark.parametrize(("a", "b", "u", "p"), [
    ([1, 2, 3], [4, 5, 6], 9, 2 / 20),  # every b above every a: 1 of C(6, 3) orders
    ([4, 5, 6], [1, 2, 3], 0, 2 / 20),
    ([1, 2, 3, 4], [5, 6, 7, 8], 16, 2 / 70),
    ([1, 3, 5], [2, 4, 6], 6, 2 * 7 / 20),  # P(U <= 3) = (1 + 1 + 2 + 3) / 20
])
def test_exact_u_and_p_by_hand(a, b, u, p):
    test = compare.mann_whitney_u(a, b)
    assert test.method == "exact"
    assert test.u == u
    assert test.p == pytest.approx(p, rel=1e-12)


def test_u_counts_are_mann_and_whitneys_distribution():
    assert compare._u_counts(3, 3) == (1, 1, 2, 3, 3, 3, 3, 2, 1, 1)
    for m, n in ((1, 1), (4, 6), (7, 3), (12, 12)):
        counts = compare._u_counts(m, n)
        assert sum(counts) == math.comb(m + n, m) and counts == counts[::-1]


def test_ties_take_the_normal_approximation_with_tie_correction():
    # midranks 1, 3, 3, 3, 5.5, 5.5, 7, 8: B's rank sum 23.5, U = 23.5 - 10 = 13.5;
    # var = 16/12 (9 - (3^3 - 3 + 2^3 - 2) / (8 7)); z = (13.5 - 8 - 0.5) / sqrt(var)
    test = compare.mann_whitney_u([1, 2, 2, 3], [2, 3, 4, 5])
    assert (test.u, test.method) == (13.5, "normal")
    z = 5.0 / math.sqrt(16 / 12 * (9 - 30 / 56))
    assert test.p == pytest.approx(math.erfc(z / math.sqrt(2)), rel=1e-12)
    assert test.p == pytest.approx(0.1366582477381475, rel=1e-12)  # scipy, asymptotic
    assert compare.mann_whitney_u([1, 1, 1], [1, 1, 1]).p == 1.0


def test_against_scipy():
    test = compare.mann_whitney_u([0.51, 0.73, 0.12, 0.98, 0.33],
                                  [0.61, 0.88, 1.2, 0.95, 1.41, 0.7, 1.05])
    assert (test.u, test.method) == (29.0, "exact")
    assert test.p == pytest.approx(0.07323232323232323, rel=1e-12)
    test = compare.mann_whitney_u(SCIPY_25_A, SCIPY_25_B)  # 25 a side, 3 ties
    assert (test.u, test.method) == (483.5, "normal")
    assert test.p == pytest.approx(0.0009382256687356581, rel=1e-9)


def test_method_and_bad_input():
    assert compare.mann_whitney_u([1, 2], [3, 4], method="normal").method == "normal"
    with pytest.raises(ValueError, match="without ties"):
        compare.mann_whitney_u([1, 2], [2, 3], method="exact")
    with pytest.raises(ValueError, match="at least one value"):
        compare.mann_whitney_u([], [1.0])
    with pytest.raises(ValueError, match="unknown method"):
        compare.mann_whitney_u([1.0], [2.0], method="t")


def test_smallest_p_and_n_too_small():
    assert compare.smallest_p(2, 2) == pytest.approx(1 / 3)
    assert compare.smallest_p(3, 3) == pytest.approx(0.1)
    assert compare.smallest_p(4, 4) == pytest.approx(2 / 70)
    two = compare.compare_values(("x", "c", "samples_per_s"), [1.0, 1.1], [2.0, 2.1])
    assert two.verdict == "n too small" and two.test.p == pytest.approx(1 / 3)
    four = compare.compare_values(("x", "c", "samples_per_s"), [1.0, 1.1, 1.2, 1.3],
                                  [2.0, 2.1, 2.2, 2.3])
    assert four.verdict == "changed" and four.ratio == pytest.approx(2.15 / 1.15)
    assert (four.ratio_min, four.ratio_max) == pytest.approx((2.0 / 1.3, 2.3 / 1.0))
    small = compare.compare_values(("x", "c", "samples_per_s"), [1.0, 1.01, 1.02, 1.03],
                                   [1.05, 1.06, 1.07, 1.08])
    assert small.verdict == "within threshold"  # significant, but 5% < 10%
    assert compare.compare_values(("x", "c", "samples_per_s"), [1.0, 1.01, 1.02, 1.03],
                                  [1.05, 1.06, 1.07, 1.08], threshold=0.01).verdict == "changed"
    mixed = compare.compare_values(("x", "c", "samples_per_s"), [1, 3, 5, 7], [2, 4, 6, 8])
    assert mixed.verdict == "not significant"


def test_a_missed_target_is_infinitely_slow():
    assert compare.run_value("time_to_target_s", None, False) == math.inf
    assert compare.run_value("time_to_target_s", 1.5, True) == math.inf  # diverged
    assert compare.run_value("samples_per_s", 100.0, True) is None  # a diverged speed
    assert compare.run_value("samples_per_s", float("nan"), False) is None
    never = compare.compare_values(("x", "c", "time_to_target_s"), [1.0, 1.1, 1.2, 1.3],
                                   [math.inf] * 4)
    assert never.ratio == math.inf and never.verdict == "changed"


# ---------------------------------------------------------------- results files


def jittered(results: dict, scale: dict[str, float] | None = None,
             jitter: tuple[float, ...] = (0.994, 1.0, 1.006)) -> dict:
    """Each run of ``results`` three times, its figures times each ``jitter``; the
    samples/s of the labels in ``scale`` times their factor too."""
    out = copy.deepcopy(results)
    runs = []
    for run in results["runs"]:
        for k, factor in enumerate(jitter):
            r = copy.deepcopy(run)
            r["run_id"] = f"{run['run_id']}-j{k}"
            for key in compare.figures():
                if isinstance(r.get(key), float):
                    r[key] *= factor
            if run["label"] in (scale or {}):
                r["samples_per_s"] *= scale[run["label"]]
            runs.append(r)
    out["runs"] = runs
    return out


@pytest.fixture
def results_pair(tmp_path):
    golden = json.loads(GOLDEN_RESULTS.read_text())
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(jittered(golden)))
    b.write_text(json.dumps(jittered(golden, {"ssgd": 0.7}, (0.997, 1.003, 1.0))))
    return a, b, golden


@needs_golden
def test_a_slower_label_is_flagged_and_nothing_else(results_pair):
    a, b, golden = results_pair
    result = compare.compare_sets(compare.load_set(str(a)), compare.load_set(str(b)))
    conditions = sorted({r["condition"] for r in golden["runs"]})
    flagged = [(c.label, c.figure) for c in result.changed]
    assert flagged == [("ssgd", "samples_per_s")] * len(conditions)
    assert len({c.configuration for c in result.changed}) == len(conditions)
    for change in result.changed:
        assert change.ratio == pytest.approx(0.7, rel=0.02)
        assert change.a["n"] == change.b["n"] == 6
    labels = {r["label"] for r in golden["runs"]}
    assert {c.label for c in result.changes} == labels  # every label was compared
    assert {c.figure for c in result.changes} >= {"samples_per_s", "time_to_target_s",
                                                  "sync_fraction"}
    assert not result.only_a and not result.only_b


@needs_golden
def test_same_against_same_flags_nothing(results_pair):
    a, _, _ = results_pair
    result = compare.compare_sets(compare.load_set(str(a)), compare.load_set(str(a)))
    assert result.changes and not result.changed
    assert all(c.ratio == 1.0 and c.test.p == 1.0 for c in result.changes
               if math.isfinite(c.a["median"]) and c.a["median"] != 0)


@needs_golden
def test_run_files_are_matched_by_what_they_record_and_two_repeats_are_too_few():
    spec = str(GOLDEN / "ssgd-*.h5")
    result = compare.compare_sets(compare.load_set(spec), compare.load_set(str(GOLDEN)))
    keys = {(c.label, c.configuration) for c in result.changes}
    assert {label for label, _ in keys} == {"ssgd"} and len(keys) == 2  # hom, s1-2-work
    assert {c.verdict for c in result.changes} <= {"n too small", "n/a"}
    assert "asgd" in {dict(k)["strategy"] for k in result.only_b} and not result.only_a


def test_a_manifest_reads_its_run_files(tmp_path):
    manifest = Path("/work/golden/sweep/manifest.json")
    if not manifest.is_file():
        pytest.skip("the golden sweep is not here")
    run_set = compare.load_set(str(manifest))
    keys = {(dict(k)["strategy"], dict(k)["world_size"]): k for k in run_set.values}
    assert set(keys) == {("ssgd", 1), ("ssgd", 2), ("oscars", 1), ("oscars", 2)}
    assert run_set.runs == 4 and run_set.values[keys[("ssgd", 2)]]["samples_per_s"][0] > 0


# ---------------------------------------------------------------- bad input
