"""``syncbench comm`` and ``simulate --calibrate`` on a shaped link (``syncbench cluster``, root).

The module brings up its own 2-node cluster (prefix ``tk``, subnet 10.82.0, links of
200 Mbit/s: 25e6 B/s of Ethernet frames, about 23.9e6 B/s of TCP payload each way) and
takes it down at the end. One 2-rank allreduce benchmark across it must

* move at least the bytes MPICH's allreduce must move through each node's link (and
  not much more), counted on the host-side veth of each node;
* show a bus bandwidth at its largest size at most 10% above the link's rate (the
  shaping holds) and at least 80% of it (two busy-polling ranks and the kernel's TCP
  work share this host's two cores: 0.86 of the rate was seen once among fresh clones);
* give ``syncbench simulate --calibrate`` a bandwidth in the same bounds;

and a short allreduce after the ranks computed must pass under the link's token bucket
(``python -m syncbench.bench.micro.after_idle``), far faster than back to back; a small
one-sided round trip must wait behind the shards on its connections, either way
(``python -m syncbench.bench.micro.rma_behind``).

200 Mbit/s rather than 1 Gbit/s: at 1 Gbit/s two busy-polling ranks and the kernel's
TCP work share this host's two cores, and the rate measured swings with other load.
Without root (or without ``ip``/``tc``) the tests skip, unless
``SYNCBENCH_REQUIRE_CLUSTER=1`` (``make test-cluster``) makes that a failure.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from cluster_helpers import TestCluster

from syncbench.bench.micro.comm import read_results
from syncbench.bench.simulate.collectives import allreduce_link_terms
from syncbench.bench.simulate.engine import have_simgrid

pytestmark = pytest.mark.cluster

TC = TestCluster("tk", "10.82.0")
LINK, LINK_BYTES_PER_S = "200mbit", 25e6
#: 4 B .. 2 MiB; each size runs SKIP + ITERATIONS times (time_loop, back to back).
MAX_SIZE, ITERATIONS, SKIP = 1 << 21, 10, 2
TOLERANCE = 0.10
#: Least share of the link's rate the largest allreduce must reach (see the module doc).
FLOOR = 0.80


@pytest.fixture(scope="module")
def cluster():
    with TC.up("--link", LINK) as state:
        yield state


@pytest.fixture(scope="module")
def allreduce(cluster, tmp_path_factory):
    """One 2-rank allreduce benchmark across the link: (results file, its rows, bytes)."""
    out = tmp_path_factory.mktemp("link") / "comm.h5"
    before = TC.link_bytes()
    proc = TC.syncbench("cluster", "mpiexec", "-n", "2", "--", sys.executable, "-m", "syncbench",
                      "comm", "--op", "allreduce", "--max-size", str(MAX_SIZE),
                      "--iterations", str(ITERATIONS), "--skip", str(SKIP), "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = TC.link_bytes()
    crossed = [(rx1 - rx0, tx1 - tx0) for (rx0, tx0), (rx1, tx1) in zip(before, after)]
    assert "2 ranks on 2 nodes" in proc.stdout, proc.stdout
    return out, read_results(str(out)), crossed


def test_each_link_carries_what_the_allreduce_must_move(allreduce):
    _, res, crossed = allreduce
    # each rank sends (and receives) k_B x size per iteration: 2(N-1)/N x size at N = 2
    payload = sum((SKIP + ITERATIONS) * allreduce_link_terms(s, 2, 2)[1] * s
                  for s in res["size"])
    for rx, tx in crossed:  # rx: sent by the node, tx: sent to it
        assert min(rx, tx) >= payload, (crossed, payload)
        # TCP/IP headers (GSO: counted once per large packet), MPI's start-up and gathers
        assert rx + tx <= 2 * 1.15 * payload + 2e6, (crossed, payload)


def test_the_links_tcp_segments_fit_its_bucket_and_cost_the_host_little(allreduce):
    """200 Mbit/s: a 51 KB bucket, so segments of at most 32 KB on both ends of each link
    (``network.segment_limit``); 64 KB ones, which tbf cut into packets, cost this host
    11-13 ns of interrupt CPU a byte sent, 32 KB ones 1.1 ns (docs/RESULTS.md)."""
    path, _, _ = allreduce
    for node in TC.nodes:
        shown = subprocess.run(["ip", "netns", "exec", node, "ip", "-d", "link", "show", "eth0"],
                               capture_output=True, text=True, check=True).stdout
        assert "gso_max_size 32768 " in shown, shown
    cpu = float(read_results(str(path))["attrs"]["link_cpu_s_per_byte"])
    assert cpu < 6e-9, cpu


def test_bus_bandwidth_is_the_link_rate(allreduce):
    _, res, _ = allreduce
    busbw = float(res["busbw_mbps"][-1]) * 1e6
    assert res["size"][-1] == MAX_SIZE
    assert FLOOR * LINK_BYTES_PER_S <= busbw <= (1 + TOLERANCE) * LINK_BYTES_PER_S, busbw


def test_calibration_fits_the_link_rate(allreduce, tmp_path):
    path, _, _ = allreduce
    if not have_simgrid():  # the same fit simulate runs, without the simulation
        from syncbench.bench.simulate.platform import calibrate

        latency, bandwidth, _ = calibrate(str(path))
    else:
        proc = TC.syncbench("simulate", "--calibrate", str(path), "--algorithm", "ssgd",
                          "--np", "2", "--steps", "2", "--out", str(tmp_path / "sim.h5"))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        m = re.search(r"latency ([\d.]+) us per exchange .* bandwidth ([\d.]+) MB/s",
                      proc.stdout)
        assert m, proc.stdout
        latency, bandwidth = float(m[1]) * 1e-6, float(m[2]) * 1e6
    assert FLOOR * LINK_BYTES_PER_S <= bandwidth <= (1 + TOLERANCE) * LINK_BYTES_PER_S, \
        bandwidth
    assert 1e-6 < latency < 200e-6  # one exchange through the stacks: some 10-30 us


def test_a_short_allreduce_after_compute_passes_under_the_links_bucket(cluster):
    """11 KB at 200 Mbit/s: 0.25-0.47 ms back to back (the rate; 0.45 ms is 11 KB at
    25 MB/s, less where the bucket refills while the stacks turn an exchange around;
    0.34 on the AMD guest, 0.35-0.47 and once 0.245 on the Intel one), about 0.04 ms
    after the ranks spun for 1 ms (the 51 KB bucket refilled and passes it at once).

    A bucket that did not refill would make both about equal; a busy host has been seen
    to stretch the stacks' part to 0.11 ms (ratio 2.7), and on an AMD EPYC guest in CI it
    was 0.127 ms against 0.252 back to back (ratio 1.98), so the bound is two thirds. The floor
    on back to back only says the link is shaped to 200 Mbit/s: at 1 Gbit/s 11 KB takes
    0.08 ms back to back (docs/RESULTS.md, "A short collective after compute")."""
    proc = TC.syncbench("cluster", "mpiexec", "-n", "2", "--", sys.executable, "-m",
                        "syncbench.bench.micro.after_idle", "--op", "allreduce",
                        "--sizes", "11264", "--repeats", "40")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    m = re.search(r"back to back ([\d.]+) .* after 1 ms ([\d.]+)", proc.stdout)
    assert m, proc.stdout
    back_to_back, after = float(m[1]), float(m[2])
    assert back_to_back > 0.15 and after < back_to_back / 1.5, proc.stdout


def test_a_gather_after_a_training_step_is_calibrated_for_the_simulator(cluster, tmp_path):
    """``after_idle --model mlp --out``: 16 KB a rank gathered after one mlp step passes
    under the bucket (about 0.04-0.07 ms against 0.55-0.68 back to back at 200 Mbit/s),
    and the file is the calibration ``simulate --calibrate-after-step`` reads. The floor on
    back to back is low for the reason the test above gives: 11 KB has been seen at 0.54
    of its rate's time in CI. Once in CI all 20 back-to-back gathers of one run took
    0.02-0.04 ms, under the bucket, while the allreduce of the same bytes in the same run
    took 0.65 ms: such a run is measured again once, and both runs' figures are kept in
    the message."""
    from syncbench.bench.simulate.after_step import load_after_step

    out = tmp_path / "after.json"
    printed = ""
    for _ in range(2):
        proc = TC.syncbench("cluster", "mpiexec", "-n", "2", "--", sys.executable, "-m",
                            "syncbench.bench.micro.after_idle", "--op", "allreduce,allgather",
                            "--sizes", "4096,16384", "--model", "mlp", "--repeats", "20",
                            "--out", str(out))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        printed += proc.stdout
        back_to_back = json.loads(out.read_text())["ops"]["allgather"]["back_to_back_s"][1]
        if back_to_back > 0.25e-3:
            break
    after = load_after_step(str(out))
    gathered = after.seconds("allgather", 16384, 2)
    assert back_to_back > 0.25e-3 and gathered < back_to_back / 2, printed
    assert after.seconds("allreduce", 8192, 2) is not None, proc.stdout


@pytest.mark.parametrize("behind", ["pushes", "replies"])
def test_a_counter_trip_waits_behind_the_shards_either_way(cluster, behind):
    """``rma_behind``: rank 1's 8-byte ``Fetch_and_op`` trips to rank 0 while rank 0 moves
    150 KB epochs (6.3 ms each at 200 Mbit/s) back to back wait behind them, whether the
    bytes are rank 0's pushes (the way of the trip's reply) or the replies rank 1 serves
    to rank 0's reads (the way of its own request): 4.26-4.27 ms at the median here,
    against 0.03-0.04 idle (docs/RESULTS.md, "ASGD's counter behind its shards: per-rank
    events and a combined trial")."""
    proc = TC.syncbench("cluster", "mpiexec", "-n", "2", "--", sys.executable, "-m",
                        "syncbench.bench.micro.rma_behind", "--bytes", "150000",
                        "--seconds", "1", "--behind", behind)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    found = dict(re.findall(r"^\s*(idle|pushing|pulling) .* round trip ([\d.]+) ms",
                            proc.stdout, re.M))
    busy = found.get("pushing" if behind == "pushes" else "pulling")
    assert "idle" in found and busy is not None, proc.stdout
    # a third of a shard's time on the wire at the least, and far above a trip alone
    assert float(busy) > 2.0 and float(busy) > 10 * float(found["idle"]), proc.stdout
