"""The PyTorch peers (DDP, PeriodicModelAverager) and ``syncbench peers``: the tests that launch
jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_peers.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import math
import os
import socket
import subprocess
import sys

import numpy as np
import pytest
from helpers import MPIEXEC  # noqa: E402
from oracles import rank_streams  # noqa: E402
from test_peers import torch
from torch.nn import functional as F  # noqa: E402

from syncbench.bench.data.catalog import load_dataset  # noqa: E402
from syncbench.bench.experiment.peers.torch_runner import (  # noqa: E402
    build_torch_model,
    evaluate,
    flat_params,
    parse_result,
)
from syncbench.kernels.zoo import build_model  # noqa: E402

SEED, SAMPLES, BATCH, EPOCHS, PERIOD = 3, 4096, 32, 1.0, 3


LR, MOMENTUM = 0.05, 0.9


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_peer(algorithm: str, save: str, np_: int = 2, model: str = "mlp",
             samples: int = SAMPLES) -> dict:
    """The runner on ``np_`` ranks (synthetic data); its ``peer-result`` record."""
    cmd = [MPIEXEC, "-n", str(np_), sys.executable, "-m",
           "syncbench.bench.experiment.peers.torch_runner",
           "--algorithm", algorithm, "--model", model, "--dataset", "synthetic",
           "--synthetic-samples", str(samples), "--epochs", str(EPOCHS), "--batch-size",
           str(BATCH), "--seed", str(SEED), "--period", str(PERIOD), "--lr", str(LR),
           "--momentum", str(MOMENTUM), "--save-model", save]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return parse_result(proc.stdout)


def serial_replicas(algorithm: str, steps: int, model: str = "mlp",
                    samples: int = SAMPLES) -> list:
    """Rank 0's final model, re-computed in this process from both ranks' streams.

    Returned as the list of replicas (rank 0's first). SSGD without BatchNorm:
    one model on both batches together; with BatchNorm (buffers), two replicas
    each normalising its own batch and stepping with the mean of their
    gradients (DDP without buffer broadcast). Local SGD: two replicas,
    parameters and running statistics averaged at the end of each round.
    """
    data = load_dataset("synthetic", synthetic_train=samples, seed=SEED)
    streams = rank_streams(data.train_x, data.train_y, 2, BATCH, SEED, dtype=np.float32)
    torch.manual_seed(SEED)
    has_bn = any(True for _ in build_torch_model(model, data.input_shape, 10).buffers())
    replicas = 1 if algorithm == "ssgd" and not has_bn else 2
    models, opts = [], []
    for _ in range(replicas):
        torch.manual_seed(SEED)
        models.append(build_torch_model(model, data.input_shape, data.num_classes))
        opts.append(torch.optim.SGD(models[-1].parameters(), lr=LR, momentum=MOMENTUM))
    torch.set_num_threads(1)
    for step in range(steps):
        batches = [s.next() for s in streams]
        if replicas == 1:  # the mean gradient over both ranks' batches
            pairs = [(torch.from_numpy(np.concatenate([b[0] for b in batches])),
                      torch.from_numpy(np.concatenate([b[1] for b in batches])))]
        else:
            pairs = [(torch.from_numpy(x), torch.from_numpy(y)) for x, y in batches]
        for net, opt, (x, y) in zip(models, opts, pairs):
            opt.zero_grad(set_to_none=True)
            F.cross_entropy(net(x), y).backward()
        if algorithm == "ssgd" and replicas == 2:  # DDP: each gradient / world, then the sum
            for p0, p1 in zip(models[0].parameters(), models[1].parameters()):
                mean = p0.grad / 2 + p1.grad / 2
                p0.grad.copy_(mean)
                p1.grad.copy_(mean)
        for opt in opts:
            opt.step()
        if algorithm == "localsgd" and ((step + 1) % PERIOD == 0 or step == steps - 1):
            pairs_to_average = [*zip(models[0].parameters(), models[1].parameters()),
                                *((b0, b1) for b0, b1 in zip(models[0].buffers(),
                                                             models[1].buffers())
                                  if b0.is_floating_point())]
            with torch.no_grad():  # torch's average_parameters: each / world, then the sum
                for p0, p1 in pairs_to_average:
                    mean = p0 / 2 + p1 / 2
                    p0.copy_(mean)
                    p1.copy_(mean)
    return models


@pytest.mark.parametrize("algorithm", ["ssgd", pytest.param("localsgd", marks=pytest.mark.slow)])
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
    expected = flat_params(serial_replicas(algorithm, steps)[0])
    if algorithm == "localsgd":  # the same float32 operations in the same order
        np.testing.assert_array_equal(got, expected)
    else:  # the mean of two ranks' means vs one mean: rounding only
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)


#: resnet8 runs: 8 steps of 32 per rank (period 3: 2 rounds and a last one of 2 steps: the
#: partial round is still there; 16 steps asserted nothing more at twice the work).
RESNET_SAMPLES = 512


@pytest.mark.slow
@pytest.mark.parametrize("algorithm", ["localsgd"])
def test_peer_runner_trains_resnet8_with_per_rank_batchnorm(algorithm, tmp_path):
    """Per-rank BatchNorm statistics under the peer, bit for bit against serial replicas.

    Local SGD averages the parameters, never the statistics: each rank's are its own,
    the case where a peer that shared them would differ. DDP's reduction against the
    serial mean is the MLP's case above (``ssgd`` here adds ``rtol`` checks of the same
    statistics at twice the time; the branch is kept for a run with ``ssgd``)."""
    save = str(tmp_path / "params.npy")
    result = run_peer(algorithm, save, model="resnet8", samples=RESNET_SAMPLES)
    data = load_dataset("synthetic", synthetic_train=RESNET_SAMPLES, seed=SEED)
    steps = int(EPOCHS * (len(data.train_y) // 2 // BATCH))
    assert result["steps"] == steps and result["model"] == "resnet8"
    assert result["last_loss"] < result["first_loss"]
    got = np.load(save)
    replicas = serial_replicas(algorithm, steps, "resnet8", RESNET_SAMPLES)
    test_loss, accuracy = evaluate(replicas[0], data.test_x, data.test_y)
    if algorithm == "localsgd":  # parameters bit for bit; rank 0's averaged statistics
        np.testing.assert_array_equal(got, flat_params(replicas[0]))
        assert math.isclose(result["test_loss"], test_loss, rel_tol=1e-5)
        assert result["accuracy"] == accuracy
    else:  # DDP's reduction order vs the serial mean; rank 0's own statistics
        np.testing.assert_allclose(got, flat_params(replicas[0]), rtol=1e-3, atol=1e-5)
        assert math.isclose(result["test_loss"], test_loss, rel_tol=1e-3)


def _rows(stdout: str) -> list[list[str]]:
    return [line.split() for line in stdout.splitlines()
            if line.strip() and not line.startswith("#")]


@pytest.mark.slow
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
        assert _within_printed_rounding(ratio, row[4:7])
    comm = [r for r in rows if len(r) == 10]
    assert len(comm) == 1 and comm[0][:3] == ["2", "mlp", str(build_model(
        "mlp", (1, 28, 28), 10).nbytes)]
    overlap, blocking, bare, tight = (float(v) for v in comm[0][3:7])
    assert min(overlap, blocking, bare, tight) > 0
    for ratio in (float(v) for v in comm[0][7:10]):
        assert 0 < ratio < math.inf


def test_peers_rejects_models_the_peer_lacks():
    proc = subprocess.run([sys.executable, "-m", "syncbench", "peers", "--speed", "--model",
                           "lenet,mlp:64"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "--model takes mlp, lenet, resnet8, resnet20" in proc.stderr


def _within_printed_rounding(ratio, printed):
    """Whether a printed ratio is the ratio of the two printed throughputs before rounding.

    Each of the three figures is printed rounded to its last digit, so the ratio of the
    unrounded throughputs lies within the printed figures' half-units."""
    ours, theirs, _ = (float(v) for v in printed)
    half = [0.5 * 10.0 ** -len(v.partition(".")[2]) for v in printed]
    low = (ours - half[0]) / (theirs + half[1]) - half[2]
    high = (ours + half[0]) / (theirs - half[1]) + half[2]
    return low <= ratio <= high


@pytest.mark.slow
def test_peers_speed_prints_single_process_ratios():
    cmd = [sys.executable, "-m", "syncbench", "peers", "--speed", "--model", "lenet,mlp",
           "--repeats", "1", "--steps", "3", "--batch-size", "16"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "# throughput-only comparison" in proc.stdout
    rows = _rows(proc.stdout)
    assert [r[:2] for r in rows] == [["lenet", "16"], ["mlp", "16"]]
    for row in rows:
        ours, theirs, ratio = (float(v) for v in row[2:5])
        assert ours > 0 and theirs > 0
        assert _within_printed_rounding(ratio, row[2:5])


@pytest.mark.slow
def test_peers_out_dir_keeps_the_runs_and_resume_reruns_none(tmp_path):
    """--out-dir keeps both sides' run files; --resume of the same plan launches nothing
    (the files are untouched and the table is the same); another plan is refused."""
    out = tmp_path / "peers"
    cmd = [sys.executable, "-m", "syncbench", "peers", "--np", "2", "--model", "mlp",
           "--algorithms", "ssgd", "--dataset", "synthetic", "--synthetic-samples", "2048",
           "--repeats", "1", "--comm-blocks", "0", "--out-dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPIEXEC": MPIEXEC}
    first = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert first.returncode == 0, first.stderr[-3000:]
    files = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert {"ssgd-mlp-np2-r0.h5", "ssgd-mlp-np2-r0-peer.json", "peers-plan.json"} <= set(files)
    again = subprocess.run([*cmd, "--resume"], capture_output=True, text=True, timeout=300,
                           env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()
            if p.name != "peers-plan.json"} == {k: v for k, v in files.items()
                                                if k != "peers-plan.json"}
    assert _rows(again.stdout) == _rows(first.stdout)
    other = subprocess.run([*cmd, "--resume", "--epochs", "2"], capture_output=True,
                           text=True, timeout=300, env=env)
    assert other.returncode == 2 and "another plan" in other.stderr
    assert len(other.stderr.strip().splitlines()) == 1
