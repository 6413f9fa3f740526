"""The parity table of ``[[parity]]`` pairs (bench/experiment/parity.py) and the scenario
keys it needs (``parity``, ``datasets``)."""

from __future__ import annotations

import pytest

from syncbench.analysis.targets import Target
from syncbench.bench.experiment.parity import PARITY_TOLERANCE, parity_table, verdict
from syncbench.bench.experiment.scenario import (
    ScenarioError,
    load_scenario,
    parse_scenario,
    resolve_dataset,
)


def records(label: str, accuracies: list[float], local: float | None = None,
            complete: bool = True) -> list[dict]:
    summary = {} if local is None else {"final_local_accuracy": local}
    return [{"label": label, "final_accuracy": a, "complete": complete, "summary": summary}
            for a in accuracies]


def test_verdict_reads_similar_as_within_one_point():
    assert verdict(0.90, 0.90 - PARITY_TOLERANCE + 1e-9) == "holds"
    assert verdict(0.90, 0.93) == "holds (better)"
    assert verdict(0.90, 0.85) == "does not hold (-5.0 points)"
    assert verdict(None, 0.85) == "-"


def test_parity_table_of_the_shipped_scenario():
    """Medians over complete repeats only, both evaluations, the verdict and the pair's
    stability line (the paper's recipe: lr 0.1, momentum 0.9, lr_local 0.1, N 4)."""
    scenario = load_scenario("odsgd-paper")
    rows = (records("paper-ssgd", [0.90, 0.91, 0.92], local=0.90)
            + records("paper-odsgd", [0.80, 0.81, 0.82], local=0.89)
            + records("paper-odsgd", [0.99], complete=False)
            + records("defaults-ssgd", [0.84]) + records("defaults-odsgd", [0.845]))
    lines = parity_table(scenario, rows, 4)
    text = "\n".join(lines)
    paper = [ln for ln in lines if ln.startswith("  paper recipe")]
    assert len(paper) == 2
    assert "0.910 (0.900–0.920)" in paper[0] and "0.810 (0.800–0.820)" in paper[0]
    assert paper[0].endswith("does not hold (-10.0 points)")
    assert "-0.010" in paper[1] and paper[1].endswith("holds")  # local: 0.89 vs 0.90
    assert "OD-SGD lr*h < 0.105" in text and "SSGD lr*h < 3.8" in text
    assert "long budget" not in text  # no runs: no rows and no bound
    defaults = [ln for ln in lines if ln.startswith("  suite defaults")]
    assert len(defaults) == 1 and defaults[0].endswith("holds")


def test_scenario_checks_parity_pairs_and_datasets():
    base = {"np": 2, "run": [{"label": "a", "algorithm": "ssgd"},
                             {"label": "b", "algorithm": "odsgd"}]}
    ok = parse_scenario({**base, "parity": [{"name": "x", "ssgd": "a", "odsgd": "b"}],
                         "datasets": ["mnist", "fashion-mnist"]}, "t", "t.toml")
    assert ok.parity == [{"name": "x", "ssgd": "a", "odsgd": "b"}]
    with pytest.raises(ScenarioError, match="odsgd = 'c' is not a run label"):
        parse_scenario({**base, "parity": [{"name": "x", "ssgd": "a", "odsgd": "c"}]},
                       "t", "t.toml")
    with pytest.raises(ScenarioError, match="'datasets' must be a list of"):
        parse_scenario({**base, "datasets": ["imagenet"]}, "t", "t.toml")


def test_dataset_preference_takes_the_first_that_is_found(tmp_path, monkeypatch):
    monkeypatch.setenv("SYNCBENCH_DATA", str(tmp_path))
    for name in ("train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                 "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (tmp_path / "mnist").mkdir(exist_ok=True)
        (tmp_path / "mnist" / name).write_bytes(b"")
    assert resolve_dataset(["mnist", "fashion-mnist"]) == "mnist"
    assert resolve_dataset(["cifar10"]) == "cifar10"  # none found: the last, which fails loudly
    assert resolve_dataset([]) is None


def test_report_of_a_results_file_reprints_the_parity_table():
    """``syncbench report RESULTS.json`` of a scenario with ``[[parity]]`` pairs prints the
    parity table the runner printed (the pairs are in the results file's scenario), at
    each rank count of ``--np 2,4`` apart."""
    import json

    from syncbench.analysis.report import runner_tables
    from syncbench.bench.experiment.parity import parity_tables
    from syncbench.bench.experiment.runner import _scenario_json

    scenario = load_scenario("odsgd-paper")
    rows = (records("paper-ssgd", [0.90, 0.91, 0.92], local=0.90)
            + records("paper-odsgd", [0.80, 0.81, 0.82], local=0.89)
            + records("defaults-ssgd", [0.84]) + records("defaults-odsgd", [0.845]))
    for counts, runs in (([4], rows), ([2, 4], [{**r, "np": n} for n in (2, 4) for r in rows
                                                if n == 4 or r["label"] != "paper-odsgd"])):
        head = _scenario_json(scenario, counts[0] if len(counts) == 1 else counts, 3,
                              Target("accuracy", 0.8))
        data = json.loads(json.dumps({"schema": "syncbench-results/1", "scenario": head,
                                      "runs": runs, "cells": []}))
        lines = runner_tables("r.json", data)
        assert lines == ["# r.json: the runner's tables as it recorded them", "",
                         *parity_tables(scenario, runs, counts)]
    assert lines.index("# at 4 ranks") > lines.index("# at 2 ranks") > 0
    at_2 = lines[lines.index("# at 2 ranks"):lines.index("# at 4 ranks")]
    assert any(ln.startswith("  paper recipe") and ln.endswith("  -") for ln in at_2)
    assert parity_tables(scenario, rows, [4]) == parity_table(scenario, rows, 4)
