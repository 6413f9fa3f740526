"""FLOP counts per training step (kernels/flops.py) against hand counts, and the FLOP,
GEMM and peak columns of ``syncbench speed``.

Split off ``tests/unit/test_flops.py``: the tests that launch a process (``mpiexec``, a
``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


def test_speed_prints_flop_columns_and_a_fraction_of_the_gemm_rate(tmp_path):
    out = tmp_path / "speed.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "syncbench", "speed", "--models", "mlp",
                           "--steps", "2", "--repeats", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("# syncbench speed: batch 64, 2 steps x 1 repeats, float32")
    assert any(line.startswith("# GEMM (measured") and "GFLOP/s" in line for line in lines)
    assert any(line.startswith("# nominal peak") for line in lines)
    header = next(line for line in lines if line.startswith("# model"))
    for column in ("params", "median [samples/s]", "ms/step", "MFLOP/step", "GFLOP/s",
                   "of GEMM"):
        assert column in header
    row = next(line for line in lines if line.startswith("  mlp"))
    tokens = row.split()
    assert len(tokens) == 9 and tokens[1] == "235146"
    assert float(tokens[6]) == pytest.approx(65.395)
    fraction = float(tokens[8])
    assert fraction > 0 and float(tokens[7]) > 0
    figures = json.loads(out.read_text())
    (model,) = figures["models"]
    assert model["flops"]["total"] == 65_395_240
    assert model["fraction_of_gemm"] > 0 and figures["gemm"]["flops_per_s"] > 0
    assert model["fraction_of_gemm"] == pytest.approx(
        model["flops_per_s"] / figures["gemm"]["flops_per_s"])
    assert model["flops_per_s"] == pytest.approx(
        65_395_240 * model["median_samples_per_s"] / 64)


def test_speed_json_into_a_missing_folder_is_one_line_and_exit_2(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "syncbench", "speed", "--models", "mlp",
                           "--json", str(tmp_path / "no" / "x.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--json" in proc.stderr and "not writable" in proc.stderr
    assert proc.stdout == ""


def test_speed_compress_prints_each_codecs_share_and_a_copys_beside_it(tmp_path):
    out = tmp_path / "speed.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "syncbench", "speed", "--models", "mlp",
                           "--compress", "int8", "--steps", "5", "--repeats", "2",
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.strip().startswith("model") and "codec" in line)
    assert "share" in header and "copy share" in header
    (codec,) = json.loads(out.read_text())["codecs"]
    assert codec["codec"] == "int8" and codec["wire_bytes"] == 235146 + 8 * 58
    assert len(codec["codec_s"]) == len(codec["copy_s"]) == len(codec["compute_s"]) == 2
    for share, seconds, step in zip(codec["copy_share"], codec["copy_s"], codec["compute_s"]):
        assert seconds > 0 and share == pytest.approx(seconds / step)
