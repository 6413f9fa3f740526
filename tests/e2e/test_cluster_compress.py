"""The bytes a compressed SSGD step declares are the bytes that cross the link (root).

The module brings up its own 2-node cluster (prefix ``tw``, subnet 10.78.0, 1 Gbit/s
links) and takes it down at the end. For each codec, two runs of SSGD on 2 nodes x 1
rank that differ only in their number of steps; the difference of the node's veth
counters between them, over the difference in steps, is what one step moves across the
link. On two ranks every reducer moves, each way, the bytes it hands to MPI per step
(``wire_bytes_per_step``: an Allreduce of B bytes sends B/2 twice; the compressed
reduce-scatter and allgather send the other rank's half of the codes, then this rank's
half of the mean), so the per-step TCP payload each way must equal the declared bytes
within 5%.

TCP payload = the veth's bytes less 66 bytes per counted packet (Ethernet 14, IPv4 20,
TCP 20 + 12 of timestamps; a GSO super-packet is counted once with one header set): at
PowerSGD's 14 KB a step, headers alone are 4-5% of the frames. Start-up, the initial
broadcast and the final evaluation are the same in both runs and cancel.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from cluster_helpers import TestCluster

from syncbench.analysis.runfile import read_run

pytestmark = pytest.mark.cluster

TC = TestCluster("tw", "10.78.0")
#: Ethernet + IPv4 + TCP with timestamps: the bytes of one counted packet that are not
#: payload.
HEADER_BYTES = 66
TOLERANCE = 0.05
#: The two runs' lengths (Fashion-MNIST epochs at 2 x 64 samples a step: 23 and 70 steps).
SHORT, LONG = "0.05", "0.15"
#: Flags per codec beyond --compress (PowerSGD compresses from the first step, and runs
#: blocking only; the others at the default overlap).
CODEC_FLAGS = {"powersgd:2": ["--powersgd-start", "0", "--comm", "blocking"]}
#: The codec of make test; the others run in make test-all.
FAST = {"fp16"}


@pytest.fixture(scope="module")
def cluster():
    with TC.up("--link", "1gbit") as state:
        yield state


def _counters() -> list[tuple[int, int, int, int]]:
    """(rx bytes, tx bytes, rx packets, tx packets) of node 1's host-side veth."""
    base = Path("/sys/class/net", TC.state["nodes"][0]["veth"], "statistics")
    return [int((base / name).read_text())
            for name in ("rx_bytes", "tx_bytes", "rx_packets", "tx_packets")]


def _train(tmp_path, codec: str, epochs: str) -> tuple[int, int, list[int]]:
    """(steps, declared bytes per step, counter deltas) of one 2-node SSGD run."""
    out = tmp_path / f"{codec.replace(':', '-')}-{epochs}.h5"
    before = _counters()
    proc = TC.syncbench("cluster", "mpiexec", "-n", "2", "--", sys.executable, "-m",
                        "syncbench", "train", "--algorithm", "ssgd", "--model", "mlp",
                        "--dataset", "fashion-mnist", "--epochs", epochs, "--eval-every", "0",
                        "--progress", "never", "--timeout", "60", "--compress", codec,
                        *CODEC_FLAGS.get(codec, []), "--out", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    delta = [b - a for a, b in zip(before, _counters())]
    run = read_run(out)
    assert int(run.attrs["nodes"]) == 2
    return len(run.ranks[0]["t_start"]), int(run.attrs["wire_bytes_per_step"]), delta


@pytest.mark.parametrize("codec", [
    pytest.param(c, marks=[] if c in FAST else [pytest.mark.slow])
    for c in ("none", "fp16", "int8", "powersgd:2", "topk:0.01")])
def test_a_steps_bytes_on_the_link_are_the_declared_bytes(cluster, tmp_path, codec):
    steps_a, declared, short = _train(tmp_path, codec, SHORT)
    steps_b, declared_b, long = _train(tmp_path, codec, LONG)
    assert declared == declared_b and steps_b > steps_a
    steps = steps_b - steps_a
    d = [b - a for a, b in zip(short, long)]
    sent = (d[0] - HEADER_BYTES * d[2]) / steps  # by node 1 (rank 0)
    received = (d[1] - HEADER_BYTES * d[3]) / steps  # by node 1 (from rank 1)
    print(f"{codec}: declared {declared} B a step, crossed {sent:.0f} B out, "
          f"{received:.0f} B in ({sent / declared - 1:+.2%}, {received / declared - 1:+.2%})")
    for payload in (sent, received):
        assert payload == pytest.approx(declared, rel=TOLERANCE), (codec, sent, received,
                                                                   declared)
