"""``syncbench train --save-model`` writes the record ``syncbench sample`` reads: an image
model's is refused in one line, a language model's is continued (the latter only where
the shakespeare corpus is under ``$SYNCBENCH_DATA``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
from helpers import corpus_root, run_mpi

from syncbench.bench.train import saved_model

SMALL = ["--dataset", "synthetic", "--synthetic-samples", "256", "--batch-size", "32",
         "--epochs", "1", "--progress", "never"]
TINY_LM = ["--model", "gpt:d=16,layers=1,heads=2,ctx=32", "--dataset", "shakespeare",
           "--batch-size", "8", "--lr", "0.3", "--epochs", "0.002", "--progress", "never"]


def sample(*argv: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "syncbench", "sample", *argv],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})


def test_an_image_models_record_is_written_and_sample_refuses_it(tmp_path):
    path = tmp_path / "mlp.npy"
    proc = run_mpi(2, "train", *SMALL, "--model", "mlp", "--save-model", str(path))
    assert proc.returncode == 0, proc.stderr
    params = np.load(path)  # still the bare parameters
    record = json.loads(saved_model.record_path(path).read_text())
    assert record == {"format": saved_model.FORMAT, "model": "mlp", "dataset": "synthetic",
                      "params": params.size, "dtype": "float32",
                      "sha256": saved_model.digest(params)}
    refused = sample(str(path))
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == (f"syncbench sample: error: {path} is a mlp model, not a "
                              "language model: sample continues text with a gpt model\n")


def test_a_language_model_trained_and_saved_is_sampled(tmp_path):
    path = tmp_path / "lm.npy"
    proc = run_mpi(1, "train", *TINY_LM, "--data-dir", corpus_root(), "--save-model",
                   str(path), timeout=300)
    assert proc.returncode == 0, proc.stderr
    saved = saved_model.load(path)
    assert (saved.model, saved.tokens, saved.vocab) == (
        "gpt:d=16,layers=1,heads=2,ctx=32", "bytes", 256)
    assert {ord(c) for c in "ROMEO:\n abc"} <= set(saved.alphabet)
    runs = [sample(str(path), "--prompt", "ROMEO:", "--tokens", "50", "--seed", "7")
            for _ in range(2)]
    assert runs[0].returncode == 0 and runs[0].stderr == "", runs[0].stderr
    assert runs[0].stdout.startswith("ROMEO:") and runs[0].stdout == runs[1].stdout
