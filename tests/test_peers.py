"""The PyTorch peers (DDP, PeriodicModelAverager) and ``syncbench peers``.

* the peer models have our architectures (same parameter counts and shapes);
* the peer runner, launched on 2 ranks under our ``mpiexec``, trains (the
  loss falls, the accuracy is far above chance) and computes what it claims:
  its final parameters equal a serial re-computation on the same shards and
  batches (DDP: one model on both ranks' batches together, up to rounding;
  Local SGD: two replicas averaged every ``--period`` steps and at the end,
  bit for bit);
* ``syncbench peers`` prints parseable fixed-column rows with the ratio of
  the medians, and the SSGD communication-efficiency row.

Skipped as a whole when PyTorch is not installed (``pip install 'syncbench[peers]'``).
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: pip install 'syncbench[peers]' (torch==2.13.0)")

from helpers import MPIEXEC, rank_streams  # noqa: E402
from torch.nn import functional as F  # noqa: E402, N812

from syncbench.bench.data import load_dataset  # noqa: E402
from syncbench.bench.peers.torch_runner import (  # noqa: E402
    build_torch_model,
    flat_params,
    parse_result,
    rank_and_size,
)
from syncbench.kernels.zoo import build_model  # noqa: E402

SEED, SAMPLES, BATCH, EPOCHS, PERIOD = 3, 4096, 32, 1.0, 3
LR, MOMENTUM = 0.05, 0.9


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_peer(algorithm: str, save: str, np_: int = 2) -> dict:
    """The runner on ``np_`` ranks (synthetic data); its ``peer-result`` record."""
    cmd = [MPIEXEC, "-n", str(np_), sys.executable, "-m", "syncbench.bench.peers.torch_runner",
           "--algorithm", algorithm, "--model", "mlp", "--dataset", "synthetic",
           "--synthetic-samples", str(SAMPLES), "--epochs", str(EPOCHS), "--batch-size",
           str(BATCH), "--seed", str(SEED), "--period", str(PERIOD), "--lr", str(LR),
           "--momentum", str(MOMENTUM), "--save-model", save]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return parse_result(proc.stdout)


def serial_replicas(algorithm: str, steps: int) -> np.ndarray:
    """Rank 0's final parameters, re-computed in this process from both ranks' streams."""
    data = load_dataset("synthetic", synthetic_train=SAMPLES, seed=SEED)
    streams = rank_streams(data.train_x, data.train_y, 2, BATCH, SEED, dtype=np.float32)
    replicas = 1 if algorithm == "ssgd" else 2
    models, opts = [], []
    for _ in range(replicas):
        torch.manual_seed(SEED)
        models.append(build_torch_model("mlp", data.input_shape, data.num_classes))
        opts.append(torch.optim.SGD(models[-1].parameters(), lr=LR, momentum=MOMENTUM))
    torch.set_num_threads(1)
    for step in range(steps):
        batches = [s.next() for s in streams]
        if algorithm == "ssgd":  # the mean gradient over both ranks' batches
            pairs = [(torch.from_numpy(np.concatenate([b[0] for b in batches])),
                      torch.from_numpy(np.concatenate([b[1] for b in batches])))]
        else:
            pairs = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]
        for model, opt, (x, y) in zip(models, opts, pairs):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            opt.step()
        if algorithm == "localsgd" and ((step + 1) % PERIOD == 0 or step == steps - 1):
            with torch.no_grad():  # torch's average_parameters: each / world, then the sum
                for p0, p1 in zip(models[0].parameters(), models[1].parameters()):
                    mean = p0 / 2 + p1 / 2
                    p0.copy_(mean)
                    p1.copy_(mean)
    return flat_params(models[0])


def test_peer_models_have_our_architectures():
    for name in ("mlp", "lenet"):
        ours = build_model(name, (1, 28, 28), 10)
        theirs = build_torch_model(name, (1, 28, 28), 10)
        assert sum(p.numel() for p in theirs.parameters()) == ours.size
        shapes = sorted(tuple(p.shape) for p in theirs.parameters())
        assert len(shapes) == sum(len(layer.param_shapes()) for layer in ours.layers)
        assert theirs(torch.zeros(3, 1, 28, 28)).shape == (3, 10)


def test_rank_and_size_from_launcher_environments():
    assert rank_and_size({"PMI_RANK": "3", "PMI_SIZE": "4"}) == (3, 4)
    assert rank_and_size({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == (1, 2)
    assert rank_and_size({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) == (0, 8)
    assert rank_and_size({}) == (0, 1)


@pytest.mark.parametrize("algorithm", ["ssgd", "localsgd"])
def test_peer_runner_trains_and_equals_serial_recomputation(algorithm, tmp_path):
    save = str(tmp_path / "params.npy")
    result = run_peer(algorithm, save)
    data = load_dataset("synthetic", synthetic_train=SAMPLES, seed=SEED)
    steps = int(EPOCHS * (len(data.train_y) // 2 // BATCH))
    assert result["steps"] == steps and result["world_size"] == 2
    assert result["peer"] == {"ssgd": "torch-ddp", "localsgd": "torch-periodic-avg"}[algorithm]
    assert result["last_loss"] < 0.5 * result["first_loss"]
    assert result["accuracy"] > 0.5  # 10 classes: chance is 0.1
    assert result["samples_per_s"] > 0
    got = np.load(save)
    expected = serial_replicas(algorithm, steps)
    if algorithm == "localsgd":  # the same float32 operations in the same order
        np.testing.assert_array_equal(got, expected)
    else:  # the mean of two ranks' means vs one mean: rounding only
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


def _rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()
            if line.strip() and not line.startswith("#")]


def test_peers_bench_prints_rows_with_ratios():
    cmd = [sys.executable, "-m", "syncbench", "peers", "--np", "2", "--model", "mlp",
           "--dataset", "synthetic", "--synthetic-samples", "2048", "--repeats", "1",
           "--comm-blocks", "2", "--comm-block-steps", "3"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPIEXEC": MPIEXEC}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "# throughput-only comparison at equal work" in proc.stdout
    rows = _rows(proc.stdout)
    throughput = [r for r in rows if len(r) == 13]
    assert [(r[0], r[1], r[2], r[3]) for r in throughput] == [
        ("2", "mlp", "ssgd", "torch-ddp"), ("2", "mlp", "localsgd", "torch-periodic-avg")]
    for row in throughput:
        ours, peer, ratio = float(row[4]), float(row[5]), float(row[6])
        assert ours > 0 and peer > 0
        assert math.isclose(ratio, ours / peer, rel_tol=2e-3)
    comm = [r for r in rows if len(r) == 10]
    assert len(comm) == 1 and comm[0][:3] == ["2", "mlp", str(build_model(
        "mlp", (1, 28, 28), 10).nbytes)]
    overlap, blocking, bare, tight = (float(v) for v in comm[0][3:7])
    assert min(overlap, blocking, bare, tight) > 0
    for ratio in (float(v) for v in comm[0][7:10]):
        assert 0 < ratio < math.inf


def test_peers_speed_prints_single_process_ratios():
    cmd = [sys.executable, "-m", "syncbench", "peers", "--speed", "--model", "lenet",
           "--repeats", "1", "--steps", "3", "--batch-size", "16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "# throughput-only comparison" in proc.stdout
    rows = _rows(proc.stdout)
    assert [r[:2] for r in rows] == [["lenet", "16"]]
    for row in rows:
        ours, theirs, ratio = (float(v) for v in row[2:5])
        assert ours > 0 and theirs > 0
        assert math.isclose(ratio, ours / theirs, rel_tol=2e-3)
