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

import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is optional: pip install 'syncbench[peers]'")

from helpers import MPIEXEC  # noqa: E402

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
# test-all; the gradient-level comparison with powerSGD_hook (tests/unit) runs in both.
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
