"""``--target-loss``: a language model's time to a target validation loss.

Rows fed to the metric functions (:func:`time_to_target`, :func:`summarize`, the
report's rows of hand-made run files), the flag checks of train, report and the
runner, and a scenario with a loss target planned and tabulated.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
from helpers import report_cli, train_args

from syncbench.analysis import schema
from syncbench.analysis.headline import headline_from_results
from syncbench.analysis.runfile import read_run
from syncbench.analysis.summary import summarize, time_to_target
from syncbench.analysis.tables import table_rows
from syncbench.analysis.targets import Target, config_target, target_of, target_problem
from syncbench.bench.experiment.plan import plan_runs
from syncbench.bench.experiment.scenario import ScenarioError, parse_scenario
from syncbench.bench.train.config import build_train_config
from syncbench.bench.train.recorder import write_run_file

NAN = math.nan
#: A language model's evaluations: losses in nats per token, no accuracy.
LM_EVALS = {"t": np.array([1.0, 2.0, 3.0, 4.0]), "step": np.array([1, 2, 3, 4]),
            "samples_seen": np.array([32, 64, 96, 128]),
            "loss": np.array([3.1, 2.4, 2.6, 1.9]), "accuracy": np.full(4, NAN)}
GPT = "gpt:d=32,layers=1,heads=2,ctx=32"


def test_a_loss_is_reached_at_or_below_the_target_an_accuracy_at_or_above():
    assert time_to_target(LM_EVALS, Target("loss", 2.4)) == 2.0  # equal counts
    assert time_to_target(LM_EVALS, Target("loss", 2.0)) == 4.0
    assert math.isnan(time_to_target(LM_EVALS, Target("loss", 1.5)))
    assert math.isnan(time_to_target(LM_EVALS, 0.5))  # NaN accuracies never reach one
    classifier = {"t": np.array([1.0, 2.0]), "accuracy": np.array([0.5, 0.9]),
                  "loss": np.array([1.0, 0.4])}
    assert time_to_target(classifier, 0.8) == time_to_target(classifier,
                                                            Target("accuracy", 0.8)) == 2.0
    nan_loss = {**LM_EVALS, "loss": np.array([NAN, NAN, 2.0, 1.0])}
    assert time_to_target(nan_loss, Target("loss", 2.5)) == 3.0


def test_the_summary_takes_either_target():
    ranks = {0: {"samples": np.array([32, 32]), "t_comm": np.zeros(2), "t_wait": np.zeros(2)}}
    lm = summarize(ranks, LM_EVALS, 4.0, None, target_loss=2.5)
    assert lm["time_to_target_s"] == 2.0 and lm["final_loss"] == 1.9
    assert math.isnan(lm["final_accuracy"])
    assert math.isnan(summarize(ranks, LM_EVALS, 4.0, None)["time_to_target_s"])
    assert tuple(lm) == schema.SUMMARY_ATTRS


@pytest.mark.parametrize(("accuracy", "loss", "message"), [
    (0.8, 2.0, "--target-accuracy and --target-loss: give one target"),
    (None, 0.0, "--target-loss must be a finite loss in nats per token > 0, got 0.0"),
    (None, -1.0, "--target-loss must be a finite loss"),
    (None, NAN, "--target-loss must be a finite loss in nats per token > 0, got nan"),
    (None, math.inf, "--target-loss must be a finite loss"),
    (1.5, None, r"--target-accuracy must be in \(0, 1\], got 1.5"),
])
def test_a_bad_target_is_one_line(accuracy, loss, message):
    problem = target_problem(accuracy, loss)
    assert problem is not None and "\n" not in problem
    assert re.search(message, problem)


def test_targets_of_flags_and_of_a_config():
    assert target_problem(0.8, None) is None and target_problem(None, 1.9) is None
    assert target_of(None, None) is None
    assert target_of(None, 1.9) == Target("loss", 1.9)
    assert f"{Target('loss', 1.9):g}" == "1.9" and Target("loss", 1.9).flag == "--target-loss"
    assert config_target({"target_accuracy": 0.8}) == Target("accuracy", 0.8)
    assert config_target({"target_accuracy": None, "target_loss": 2.0}) == Target("loss", 2.0)
    assert config_target({}) is None  # an older file without either


def write_lm(path: Path, target_loss: float | None, model: str = GPT,
             evals: dict | None = None, wall: float = 4.0) -> str:
    """A 2-rank run file of a language model: 4 steps of 16 windows per rank."""
    rows = {r: {**{name: np.zeros(4, dtype=kind) for name, kind in
                   schema.RANK_COLUMNS.items()},
                "step": np.arange(4), "t_start": np.arange(4.0), "t_compute": np.full(4, 0.25),
                "loss": np.linspace(3.0, 2.0, 4), "samples": np.full(4, 16),
                "round": np.arange(4)}
            for r in range(2)}
    root = {"algorithm": "ssgd", "model": model, "dataset": "shakespeare", "world_size": 2,
            "config": {"algorithm": "ssgd", "batch_size": 16, "target_accuracy": None,
                       "target_loss": target_loss},
            "hostnames": ["n0", "n1"]}
    attrs = {r: {"hostname": f"n{r}", "device": "cpu", "slowdown": 1.0} for r in range(2)}
    write_run_file(path, root, rows, attrs, evals or LM_EVALS, wall, None,
                   target_loss=target_loss)
    return str(path)


def test_a_language_models_row_has_its_loss_target_and_tokens_not_an_accuracy(tmp_path):
    path = write_lm(tmp_path / "lm.h5", 2.5)
    run = read_run(path)
    assert run.summary["time_to_target_s"] == 2.0
    (row,) = table_rows([run])
    assert row["time_to_target_s"] == 2.0 and row["target_reached"] == 1
    assert row["target_loss"] == 2.5 and row["target_accuracy"] is None
    assert math.isnan(row["final_accuracy"]) and math.isnan(row["best_accuracy"])
    assert row["samples_per_s"] == 2 * 4 * 16 / 4.0
    assert row["tokens_per_s"] == row["samples_per_s"] * 32  # windows of ctx=32 tokens
    # another target recomputes the time from the evaluation rows
    (again,) = table_rows([run], target_loss=2.0)
    assert again["time_to_target_s"] == 4.0 and again["target_loss"] == 2.0
    (missed,) = table_rows([run], target_loss=1.0)
    assert math.isnan(missed["time_to_target_s"]) and missed["target_reached"] == 0
    default_gpt = read_run(write_lm(tmp_path / "g.h5", None, model="gpt"))
    assert table_rows([default_gpt])[0]["tokens_per_s"] == 32.0 * 64  # ctx 64
    assert table_rows([default_gpt])[0]["target_reached"] is None


def test_a_classifier_has_no_tokens_per_second(tmp_path):
    path = write_lm(tmp_path / "mlp.h5", None, model="mlp",
                    evals={**LM_EVALS, "accuracy": np.array([0.5, 0.6, 0.7, 0.8])})
    (row,) = table_rows([read_run(path)], target_accuracy=0.7)
    assert row["tokens_per_s"] is None and row["time_to_target_s"] == 3.0


def test_report_takes_a_loss_target_and_refuses_it_on_a_classifier(tmp_path, capsys):
    lm = write_lm(tmp_path / "lm.h5", None)
    rc, out, err = report_cli(lm, "--format", "json", "--target-loss", "2.0", capsys=capsys)
    assert rc == 0, err
    assert '"time_to_target_s": 4.0' in out and '"target_loss": 2.0' in out
    mlp = write_lm(tmp_path / "mlp.h5", None, model="mlp",
                   evals={**LM_EVALS, "accuracy": np.array([0.5, 0.6, 0.7, 0.8])})
    for argv, message in (
            ((mlp, "--target-loss", "2.0"), "--target-loss: " + mlp + " is a classifier"),
            ((lm, "--target-loss", "0"), "--target-loss must be a finite loss"),
            ((lm, "--target-loss", "nan"), "--target-loss must be a finite loss"),
            ((lm, "--target-loss", "2", "--target-accuracy", "0.5"), "give one target")):
        rc, out, err = report_cli(*argv, capsys=capsys)
        assert rc == 2 and message in err and err.count("\n") == 1, err


def test_report_compare_takes_a_loss_target(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    write_lm(a / "lm.h5", None, wall=4.0)
    slower = {**LM_EVALS, "t": LM_EVALS["t"] * 2}
    write_lm(b / "lm.h5", None, evals=slower, wall=8.0)
    rc, out, err = report_cli(str(a), str(b), "--compare", "--format", "json",
                              "--target-loss", "2.5", capsys=capsys)
    assert rc == 0, err

    change = next(c for c in json.loads(out) if c["figure"] == "time_to_target_s")
    assert change["ratio"] == pytest.approx(2.0)
    rc, _, err = report_cli(str(a), str(b), "--compare", "--target-loss", "-1", capsys=capsys)
    assert rc == 2 and err.count("\n") == 1


@pytest.mark.parametrize(("flags", "message"), [
    (("--target-loss", "2.0"), "--target-loss: fashion-mnist trains a classifier"),
    (("--dataset", "shakespeare", "--model", "gpt", "--target-loss", "0"),
     "--target-loss must be a finite loss"),
    (("--dataset", "shakespeare", "--model", "gpt", "--target-loss", "nan"),
     "--target-loss must be a finite loss"),
    (("--dataset", "shakespeare", "--model", "gpt", "--target-loss", "2",
      "--target-accuracy", "0.5"), "give one target"),
])
def test_train_refuses_a_bad_loss_target_in_one_line(flags, message):
    with pytest.raises(ValueError, match=message) as raised:
        build_train_config(train_args("--dataset", "fashion-mnist", *flags), 2)
    assert "\n" not in str(raised.value)


def test_train_takes_a_loss_target_for_a_language_model():
    config = build_train_config(train_args("--dataset", "shakespeare", "--model", "gpt",
                                           "--target-loss", "2.0", "--stop-at-target"), 2)
    assert config.target() == Target("loss", 2.0)
    assert config.record()["target_loss"] == 2.0


LM_SCENARIO = {"np": 2, "target_loss": 2.2, "flags": {"model": "gpt", "dataset": "shakespeare"},
               "run": [{"label": "ssgd", "algorithm": "ssgd"},
                       {"label": "localsgd", "algorithm": "localsgd"}]}


def test_a_scenario_with_a_loss_target_plans_train_runs_with_it(tmp_path):
    scenario = parse_scenario(dict(LM_SCENARIO), "lm", "lm.toml")
    assert scenario.target == Target("loss", 2.2)
    plan = plan_runs(scenario, 2, 1, 0, tmp_path, [], scenario.target)
    for p in plan:
        i = p.args.index("--target-loss")
        assert p.args[i + 1] == "2.2" and "--target-accuracy" not in p.args
    with pytest.raises(ScenarioError, match="give one target"):
        parse_scenario({**LM_SCENARIO, "target_accuracy": 0.8}, "lm", "lm.toml")
    with pytest.raises(ScenarioError, match="'target_loss' must be"):
        parse_scenario({**LM_SCENARIO, "target_loss": -1}, "lm", "lm.toml")
    with pytest.raises(ScenarioError, match="--target-loss: fashion-mnist trains a classifier"):
        mlp = {**LM_SCENARIO, "flags": {"model": "mlp", "dataset": "fashion-mnist"}}
        plan_runs(parse_scenario(mlp, "x", "x.toml"), 2, 1, 0, tmp_path, [], Target("loss", 2))


def test_the_headline_of_a_loss_scenario_says_loss():
    results = {"scenario": {"name": "lm", "baseline": "ssgd", "target_accuracy": None,
                            "target_loss": 2.2, "repeats": 1}, "cells": [], "runs": []}
    head = headline_from_results(results)
    assert head.target == 2.2 and head.target_metric == "loss"
    head = headline_from_results({"scenario": {"target_accuracy": 0.8}, "cells": []})
    assert head.target == 0.8 and head.target_metric == "accuracy"


def test_the_runners_line_of_a_language_model_shows_its_loss(tmp_path):
    from syncbench.bench.experiment.runner import _progress

    scenario = parse_scenario(dict(LM_SCENARIO), "lm", "lm.toml")
    planned = plan_runs(scenario, 2, 1, 0, tmp_path, [], scenario.target)[0]
    run = read_run(write_lm(tmp_path / "lm.h5", 2.5))
    line = _progress(1, 1, planned, run, 3.0, kept=False)
    assert "val loss 1.9000" in line and "to target 2.00s" in line
    assert "accuracy" not in line


def test_a_diverged_language_models_perplexity_is_infinite_not_an_error():
    from syncbench.kernels.gpt import lm_metrics

    assert lm_metrics(1000.0)["perplexity"] == math.inf  # exp(1000) is past float's range
    assert lm_metrics(2.0)["perplexity"] == pytest.approx(math.exp(2.0))
