"""A language model in the training pipeline: its result clause, its divergence rule, and
``syncbench train --model gpt --dataset shakespeare`` on 1 and 2 ranks (the latter two
only where the corpus is under ``$SYNCBENCH_DATA``)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from helpers import corpus_root, run_mpi

from syncbench.analysis.runfile import read_run
from syncbench.analysis.summary import divergence
from syncbench.bench.data import text
from syncbench.bench.train.evaluation import quality
from syncbench.bench.train.slowdown import ModelWork
from syncbench.kernels.zoo import build_model

TINY = ["--model", "gpt:d=32,layers=1,heads=2,ctx=32", "--dataset", "shakespeare",
        "--batch-size", "8", "--lr", "0.3", "--epochs", "0.002", "--progress", "never"]


def test_the_result_clause_of_a_language_model_has_no_accuracy():
    lm = quality({"final_accuracy": math.nan, "final_loss": math.log(2) * 2})
    assert lm == "val loss 1.3863 nats/token  2.0000 bits/char  perplexity 4.00"
    assert quality({"final_accuracy": 0.5, "final_loss": 1.0}) == "accuracy 0.5000  loss 1.0000"


def test_a_language_model_diverged_when_it_does_no_better_than_uniform_guessing():
    ranks = {0: {"loss": np.array([5.0, 4.0]), "step": np.arange(2)}}
    evals = {"accuracy": np.array([math.nan, math.nan]), "loss": np.array([5.0, 3.0])}
    assert divergence(ranks, evals, 256) is None
    evals["loss"][-1] = 5.6
    assert "uniform guessing" in divergence(ranks, evals, 256)


@pytest.mark.parametrize("ranks", [1, 2])
def test_train_gpt_on_shakespeare(tmp_path, ranks):
    out = tmp_path / "lm.h5"
    proc = run_mpi(ranks, "train", *TINY, "--data-dir", corpus_root(), "--out", str(out),
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "nats/token" in proc.stdout and "accuracy" not in proc.stdout
    run = read_run(out)
    assert np.isnan(run.eval["accuracy"]).all()
    assert run.eval["loss"][-1] < math.log(256)
    assert run.attrs["data_sha256"] == text.CORPUS_SHA256


def test_slowdown_work_runs_a_language_model_on_token_windows():
    model = build_model("gpt:d=16,layers=1,heads=2,ctx=8", (8,), 256, seed=1)
    params = model.params.copy()
    work = ModelWork(build_model("gpt:d=16,layers=1,heads=2,ctx=8", (8,), 256, seed=1), 4)
    work(time.perf_counter() + 1.0)  # a pass takes about a millisecond
    assert work.passes >= 1 and work.x.shape == work.y.shape == (4, 8)
    np.testing.assert_array_equal(model.params, params)
