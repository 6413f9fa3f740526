"""``syncbench train --target-loss`` end to end: a tiny ``gpt`` on the Shakespeare corpus
(where it is under ``$SYNCBENCH_DATA``) stops at its target validation loss, and the run
file and ``syncbench report`` carry the loss target, tokens/s and no accuracy."""

from __future__ import annotations

import json
import math

import numpy as np
from helpers import report_cli, run_mpi
from test_lm_train import TINY, corpus_root

from syncbench.analysis.runfile import read_run


def test_train_stops_at_its_target_loss_and_the_report_reads_it(tmp_path, capsys):
    out = tmp_path / "lm.h5"
    target = 5.2  # below uniform guessing's ln 256 = 5.55, reached in a few dozen steps
    proc = run_mpi(1, "train", *TINY, "--epochs", "0.02", "--eval-every", "0.001",
                   "--target-loss", str(target), "--stop-at-target",
                   "--data-dir", corpus_root(), "--out", str(out), timeout=300)
    assert proc.returncode == 0, proc.stderr
    run = read_run(out)
    losses, times = run.eval["loss"], run.eval["t"]
    first = int(np.flatnonzero(losses <= target)[0])
    assert run.summary["time_to_target_s"] == times[first]
    assert first == len(losses) - 1  # --stop-at-target ended training there
    assert run.config["target_loss"] == target and run.config["target_accuracy"] is None
    rc, text, err = report_cli(str(out), "--format", "json", capsys=capsys)
    assert rc == 0, err
    (row,) = json.loads(text)
    assert row["target_loss"] == target and row["target_reached"] == 1
    assert row["final_accuracy"] is None or math.isnan(row["final_accuracy"])
    assert row["tokens_per_s"] == row["samples_per_s"] * 32  # TINY's ctx
