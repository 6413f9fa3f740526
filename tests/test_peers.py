"""The PyTorch peers (DDP, PeriodicModelAverager) and ``syncbench peers``.

* the peer models have our architectures (same parameter counts and shapes);
  the BatchNorm ResNets (``resnet8``, ``resnet20``) have He et al.'s CIFAR
  architecture: parameter counts worked out by hand, planes 28-14-7 and
  32-16-8, the option-A shortcut, the suite's initialisation, and one
  training step updates every parameter and the running statistics;
* the peer runner, launched on 2 ranks under our ``mpiexec``, trains (the
  loss falls, the accuracy is far above chance) and computes what it claims:
  its final parameters equal a serial re-computation on the same shards and
  batches (DDP: one model on both ranks' batches together, up to rounding;
  with BatchNorm, two replicas each normalising its own batch and stepping
  with the mean gradient; Local SGD: two replicas averaged every
  ``--period`` steps and at the end, bit for bit, and with BatchNorm the
  running statistics averaged with them: rank 0's test loss is the serial
  replica's);
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
from torch.nn import functional as F  # noqa: E402

from syncbench.bench.data.catalog import load_dataset  # noqa: E402
from syncbench.bench.experiment.peers.torch_runner import (  # noqa: E402
    MODELS,
    build_torch_model,
    evaluate,
    flat_params,
    parse_result,
    rank_and_size,
    step_throughput,
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


def _resnet_size(blocks: int, in_channels: int, num_classes: int) -> int:
    """Parameters of the CIFAR ResNet with ``blocks`` blocks per stage, counted by hand."""
    conv = lambda cin, cout: cin * cout * 9  # noqa: E731 - 3x3, no bias
    bn = lambda c: 2 * c  # noqa: E731 - gamma, beta
    size = conv(in_channels, 16) + bn(16)
    cin = 16
    for cout in (16, 32, 64):
        for _ in range(blocks):
            size += conv(cin, cout) + bn(cout) + conv(cout, cout) + bn(cout)
            cin = cout
    return size + 64 * num_classes + num_classes


def test_peer_models_have_our_architectures():
    for name in MODELS:
        ours = build_model(name, (1, 28, 28), 10)
        theirs = build_torch_model(name, (1, 28, 28), 10)
        assert sum(p.numel() for p in theirs.parameters()) == ours.size
        shapes = sorted(tuple(p.shape) for p in theirs.parameters())
        assert len(shapes) == sum(len(layer.param_shapes()) for layer in ours.layers)
        assert theirs(torch.zeros(3, 1, 28, 28)).shape == (3, 10)
    for name, shape in (("resnet8", (1, 28, 28)), ("resnet20", (3, 32, 32))):
        # flat order parameter for parameter: torch's Linear weight is the suite's transposed
        ours = [s for layer in build_model(name, shape, 10).layers for s in layer.param_shapes()]
        theirs = [tuple(p.shape) for p in build_torch_model(name, shape, 10).parameters()]
        assert theirs[:-2] == [tuple(s) for s in ours[:-2]]
        assert theirs[-2:] == [tuple(reversed(ours[-2])), tuple(ours[-1])]
        with pytest.raises(ValueError, match="28x28 or 32x32"):
            build_torch_model(name, (shape[0], 30, 30), 10)


def test_peer_resnets_have_he_et_al_cifar_architecture():
    assert MODELS == ("mlp", "lenet", "resnet8", "resnet20")
    resnet8 = build_torch_model("resnet8", (1, 28, 28), 10)
    # conv + BN, stage 1, stage 2, stage 3, linear (the numbers of the issue)
    expected = (144 + 32 + 2 * (2304 + 32) + 4608 + 64 + 9216 + 64
                + 18432 + 128 + 36864 + 128 + 650)
    assert expected == 75002 == _resnet_size(1, 1, 10)
    assert sum(p.numel() for p in resnet8.parameters()) == expected
    resnet20 = build_torch_model("resnet20", (3, 32, 32), 10)
    assert sum(p.numel() for p in resnet20.parameters()) == _resnet_size(3, 3, 10) == 269722
    assert (sum(p.numel() for p in build_torch_model("resnet20", (1, 28, 28), 100).parameters())
            == _resnet_size(3, 1, 100))
    # parameters() order: stem conv, BN gamma, beta; per block conv, BN, BN, conv, BN, BN;
    # linear weight (out, in) and bias
    shapes = [tuple(p.shape) for p in resnet8.parameters()]
    assert shapes[:6] == [(16, 1, 3, 3), (16,), (16,), (16, 16, 3, 3), (16,), (16,)]
    assert shapes[9:12] == [(32, 16, 3, 3), (32,), (32,)]
    assert shapes[-2:] == [(10, 64), (10,)]
    assert len(shapes) == 3 + 6 * 3 + 2
    assert len([p for p in resnet20.parameters()]) == 3 + 6 * 9 + 2
    for name, shape, planes in (("resnet8", (1, 28, 28), (28, 14, 7)),
                                ("resnet20", (3, 32, 32), (32, 16, 8))):
        model = build_torch_model(name, shape, 10)
        x, seen = torch.zeros(3, *shape), []
        for module in model:  # the Sequential's layers, in order
            x = module(x)
            if type(module).__name__ == "BasicBlock":
                seen.append(tuple(x.shape[1:]))
        assert x.shape == (3, 10)
        blocks = len(seen) // 3
        assert seen == [(c, p, p) for c, p in zip((16, 32, 64), planes) for _ in range(blocks)]


def test_peer_resnet_shortcut_bn_and_initialisation():
    model = build_torch_model("resnet8", (1, 28, 28), 10)
    shortcut = model[4].shortcut  # stage 2's first block: 16 -> 32 channels, stride 2
    x = torch.randn(2, 16, 28, 28)
    out = shortcut(x)
    assert out.shape == (2, 32, 14, 14)
    assert torch.equal(out[:, :16], x[:, :, ::2, ::2])  # the input's channels first
    assert not out[:, 16:].any()  # then zeros (appended, not split on both sides)
    assert not list(shortcut.parameters())
    assert type(model[3].shortcut).__name__ == "Identity"
    for module in model.modules():
        if isinstance(module, torch.nn.BatchNorm2d):
            assert (module.eps, module.momentum) == (1e-5, 0.1)
            assert torch.equal(module.weight, torch.ones_like(module.weight))
            assert not module.bias.any() and not module.running_mean.any()
            assert torch.equal(module.running_var, torch.ones_like(module.running_var))
        elif isinstance(module, (torch.nn.Conv2d, torch.nn.Linear)):
            fan_in = module.weight[0].numel()
            bound = math.sqrt(6.0 / fan_in)
            w = module.weight.detach()
            assert w.abs().max() <= bound and w.abs().max() > 0.8 * bound  # sqrt(6/fan_in)
            if isinstance(module, torch.nn.Conv2d):
                assert module.bias is None
            else:
                assert not module.bias.any()


@pytest.mark.parametrize("name", ["resnet8", "resnet20"])
def test_peer_resnet_training_step_updates_parameters_and_statistics(name):
    torch.manual_seed(0)
    model = build_torch_model(name, (1, 28, 28), 10)
    model.train()
    before = [p.detach().clone() for p in model.parameters()]
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = torch.randn(8, 1, 28, 28), torch.randint(0, 10, (8,))
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    assert math.isfinite(float(loss.detach()))
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
    assert model[1].running_mean.any() and int(model[1].num_batches_tracked) == 1
    model.eval()  # running statistics: the same output for the same input
    with torch.no_grad():
        assert torch.equal(model(x[:2]), model(x[:2]))
    assert step_throughput(name, 4, 1) > 0


def test_rank_and_size_from_launcher_environments():
    assert rank_and_size({"PMI_RANK": "3", "PMI_SIZE": "4"}) == (3, 4)
    assert rank_and_size({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}) == (1, 2)
    assert rank_and_size({"SLURM_PROCID": "0", "SLURM_NTASKS": "8"}) == (0, 8)
    assert rank_and_size({}) == (0, 1)


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


def test_peers_plan_alternates_ours_and_the_peer_and_keeps_complete_peer_records(tmp_path):
    import argparse
    import json

    from syncbench.bench.commands.peers import add_arguments
    from syncbench.bench.experiment.peers.pairs import plan_cell
    from syncbench.bench.experiment.plan import kept_run

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args(["--repeats", "2", "--train-flags", "--comm blocking"])
    plan = plan_cell(args, 2, "mlp", "ssgd", tmp_path)
    assert [(p.repeat, p.program) for p in plan] == [
        (0, "train"), (0, "torch"), (1, "train"), (1, "torch")]
    ours, peer = plan[:2]
    assert ours.args[:2] == ("--algorithm", "ssgd") and "blocking" in ours.args
    assert "--comm" not in peer.args and peer.args[-2:] == ("--out", str(peer.path))
    # the runner's resume check reads a peer's record as the run file of its point
    assert kept_run(peer) == (None, "")
    record = {"peer": "torch-ddp", "algorithm": "ssgd", "world_size": 2,
              "samples_per_s": 1.0, "accuracy": 0.5}
    peer.path.write_text(json.dumps(record))
    assert kept_run(peer) == (record, "")
    peer.path.write_text(json.dumps({**record, "world_size": 4}))
    assert kept_run(peer)[0] is None


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
