"""PyTorch's DDP communication hooks as the peer of ``--compress`` (``syncbench peers
--train-flags '--compress ...'``): the runner registers ``fp16_compress_hook`` or
``powerSGD_hook`` and trains, the plan hands the peer our codec, and a codec without a
CPU peer is one line and exit 2."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is optional: pip install 'syncbench[peers]'")

from helpers import MPIEXEC  # noqa: E402

from syncbench.algorithms.codecs import PowerSGD  # noqa: E402
from syncbench.bench.experiment.peers.pairs import peer_ssgd_flags, plan_cell  # noqa: E402
from syncbench.bench.experiment.peers.torch_runner import parse_result  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_peer(*flags: str) -> subprocess.CompletedProcess:
    cmd = [MPIEXEC, "-n", "2", sys.executable, "-m",
           "syncbench.bench.experiment.peers.torch_runner", "--algorithm", "ssgd",
           "--model", "lenet", "--dataset", "synthetic", "--synthetic-samples", "2048",
           "--batch-size", "32", "--seed", "3", "--lr", "0.05", *flags]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(_free_port())}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env)


# Both launch PyTorch DDP on 2 ranks (16 s each), so make test leaves them to make
# test-all; the gradient-level comparison with powerSGD_hook (below) runs in both.
@pytest.mark.parametrize("spec", [pytest.param("fp16", marks=pytest.mark.slow),
                                  pytest.param("powersgd:2", marks=pytest.mark.slow)])
def test_the_peer_trains_with_pytorchs_hook(spec):
    proc = run_peer("--compress", spec, "--powersgd-start", "4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = parse_result(proc.stdout)
    assert result["compress"] == spec
    assert result["last_loss"] < result["first_loss"]


@pytest.mark.parametrize("flags,says", [
    (["--compress", "int8"], "hooks for fp16, powersgd (powersgd[:R]) only"),
    (["--compress", "powersgd:2", "--powersgd-start", "1"], "must be > 1"),
])
def test_the_peer_refuses_what_pytorch_lacks(flags, says):
    proc = run_peer(*flags)
    assert proc.returncode == 2 and says in proc.stderr, proc.stderr[-2000:]


def test_peers_hands_the_peer_our_codec(tmp_path):
    flags = "--comm blocking --compress powersgd:2 --powersgd-start=10"
    assert peer_ssgd_flags(flags) == ["--compress", "powersgd:2", "--powersgd-start", "10"]
    args = argparse.Namespace(model="mlp", dataset="synthetic", epochs=1.0, batch_size=32,
                              seed=0, synthetic_samples=1024, period=4, repeats=1,
                              train_flags=flags)
    ours, peer = plan_cell(args, 2, "mlp", "ssgd", tmp_path)
    assert "--compress" in ours.args and "--comm" in ours.args
    assert peer.args[peer.args.index("--compress") + 1] == "powersgd:2"
    assert "--comm" not in peer.args


def test_peers_refuses_a_codec_without_a_peer():
    proc = subprocess.run([sys.executable, "-m", "syncbench", "peers", "--np", "2",
                           "--algorithms", "ssgd", "--train-flags",
                           "--comm blocking --compress topk:0.01"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "syncbench peers: --compress topk:0.01: the PyTorch peer has hooks for fp16, "
        "powersgd (powersgd[:R]) only"]


def pytorch_initial_qs(seed: int, shapes: list[tuple[int, int]], rank: int) -> list[np.ndarray]:
    """The hook's first Qs: ``manual_seed(RandomState(seed).randint(1e9))``, then one
    ``randn(1, cols, r)`` per compressed tensor (distinct shapes: in tensor order)."""
    draw = np.random.RandomState(seed).randint(1_000_000_000)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(draw)
        return [torch.randn(1, cols, min(rows, cols, rank))[0].numpy().copy()
                for rows, cols in shapes]


def test_powersgd_follows_pytorchs_hook_step_for_step(tmp_path):
    """The real ``powerSGD_hook`` (gloo, one rank, in a process of its own:
    ``powersgd_hook_steps.py`` says why) and our state fed the same gradients for two
    plain and five compressed steps, with PyTorch's first Q: result, P, Q and the error
    agree to 1e-5 of their largest magnitude at every step (float32 GEMMs in different
    BLAS; warm start carries the differences, error feedback does not grow them beyond
    that here)."""
    shapes = [(20, 10), (10,), (6, 2, 3, 3), (6,), (4, 4)]
    rank, start, steps = 2, 2, 7
    ours = PowerSGD(rank=rank, start_iter=start, seed=0).state(shapes)
    compressed = [(s.rows, s.cols) for s in ours.layout.compressed]
    assert compressed == [(20, 10), (6, 18)]
    rng = np.random.default_rng(20)
    grads = np.stack([rng.standard_normal(ours.layout.size).astype(np.float32)
                      for _ in range(steps)])
    np.savez(tmp_path / "in.npz", grads=grads, rank=rank, start=start, seed=0,
             shapes=np.array([d for s in shapes for d in s]),
             ndims=np.array([len(s) for s in shapes]))
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("powersgd_hook_steps.py")),
                           str(tmp_path / "in.npz"), str(tmp_path / "out.npz")],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = np.load(tmp_path / "out.npz")

    def close(a, b):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(np.abs(b).max(), 1e-30))

    for step, grad in enumerate(grads):
        result = theirs[f"result_{step}"]
        if not ours.compressing:
            ours.finish_plain()
            np.testing.assert_array_equal(result, grad)  # one rank: the mean is the gradient
            continue
        if step == start:
            ours.qs = pytorch_initial_qs(0, compressed, rank)
        m = ours.prepare(grad)
        p_sum = ours.p_buffer(m)
        q_sum = ours.q_buffer(m, p_sum)
        ps = np.concatenate([p.reshape(-1) for p in ours.ps])
        out = ours.finish(m, q_sum, ours.uncompressed_buffer(m), 1)
        close(out, result)
        close(ps, theirs[f"p_{step}"])
        close(np.concatenate([q.reshape(-1) for q in ours.qs]), theirs[f"q_{step}"])
        close(ours.error, theirs[f"error_{step}"])
    assert ours.step == int(theirs["iter"]) == steps
