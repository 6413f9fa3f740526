"""Faults only a network brings: the hang guard's probes (no root) and, on the emulated
cluster (``syncbench cluster``, as root, marked ``cluster``), a link taken down and a
node's ranks killed in the middle of a run, under MPICH and Open MPI.

The cluster tests bring up their own 2-node cluster (prefix ``tf``, subnet 10.81.0,
links unshaped) and take it down at the end. Without root (or ``ip``/``unshare``) they
skip, unless ``SYNCBENCH_REQUIRE_CLUSTER=1`` (``make test-cluster``) makes that a failure.
A node's ranks are found through ``ip netns pids`` (a node is a network namespace only:
``pkill`` inside it would see, and kill, every process of the host).
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cluster_helpers import TestCluster, launchers

from syncbench.analysis.runfile import read_run
from syncbench.bench.mpi import reach
from syncbench.bench.mpi.watchdog import Survey, Watchdog, _ranks

TC = TestCluster("tf", "10.81.0")
SUBNET = TC.subnet
NODES = TC.nodes
#: The runs' hang guard; a job must end within it and :data:`END_SLACK_S`.
TIMEOUT_S = 5
END_SLACK_S = 8
TRAIN = ["train", "--algorithm", "ssgd", "--model", "mlp", "--dataset", "synthetic",
         "--epochs", "1000", "--eval-every", "0", "--progress", "never",
         "--timeout", str(TIMEOUT_S), "--flush-every", "0.2"]


# -- the guard's probes and line (no root, no MPI job) ------------------------------
def _silent_listener() -> tuple[socket.socket, socket.socket]:
    """A loopback port that never answers: listening with a backlog of 0 and its accept
    queue filled by one connection nobody accepts, so Linux drops every further SYN
    (``tcp_conn_request``: a full accept queue drops the SYN, no RST) and a connect only
    times out, as to a host that is gone from the network. An unrouted address (TEST-NET)
    is not silent everywhere: a host's transparent proxy may answer for any address."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    return server, socket.create_connection(server.getsockname(), timeout=1)


def test_probe_tells_a_live_rank_from_a_gone_one_and_a_silent_address():
    listener = reach.Listener()
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    gone_port = closed.getsockname()[1]
    closed.close()  # bound, never listening: the port refuses
    silent = _silent_listener()
    quiet = silent[0].getsockname()
    try:
        found = reach.probe({"live": [("127.0.0.1", listener.port)],
                             "gone": [("127.0.0.1", gone_port)],
                             "silent": [quiet],
                             "either": [quiet, ("127.0.0.1", listener.port)]},
                            timeout=0.5)
    finally:
        listener.close()
        for sock in silent:
            sock.close()
    assert found == {"live": reach.ANSWERS, "gone": reach.REFUSED,
                     "silent": reach.UNREACHABLE, "either": reach.ANSWERS}


def test_targets_use_loopback_on_the_host_and_only_addresses_one_host_has():
    peers = [reach.Peer(0, "a", ("10.0.0.1", "172.17.0.1"), 1000),
             reach.Peer(1, "a", ("10.0.0.1", "172.17.0.1"), 1001),
             reach.Peer(2, "b", ("10.0.0.2", "172.17.0.1"), 1002)]
    where = reach.targets(peers[0], peers[1:], peers)
    assert where == {1: [("127.0.0.1", 1001)], 2: [("10.0.0.2", 1002)]}


def test_launcher_addresses_from_hydra_and_prrte_command_lines():
    assert reach.addresses_in(["hydra_pmi_proxy", "--control-port", "10.79.0.254:37475",
                               "--proxy-id", "1"]) == ["10.79.0.254"]
    uri = "prterun-vm-1@0.0;tcp://192.0.2.2,10.79.0.254:55453:64,24,24;tcp6://[fd00::2]:1:64"
    assert reach.addresses_in(["prted", "--prtemca", "prte_hnp_uri", f'"{uri}"']) == \
        ["192.0.2.2", "10.79.0.254"]
    assert reach.addresses_in(["python", "-m", "syncbench"]) == []


def test_the_prrte_process_to_end_is_the_one_the_launcher_started():
    assert reach.prrte_root([(12, "prted"), (11, "prted")]) == 11  # ssh: prted forks one
    assert reach.prrte_root([(12, "prterun")]) == 12  # a rank on the launcher's host
    assert reach.prrte_root([(12, "hydra_pmi_proxy"), (11, "mpiexec")]) is None
    assert reach.prrte_root([]) is None


def test_ranks_are_listed_in_spans():
    assert _ranks([3]) == "rank 3"
    assert _ranks([7, 1, 4, 5, 6]) == "ranks 1, 4-7"


def test_the_line_names_the_unreachable_node_and_the_gone_rank(tmp_path):
    peers = [reach.Peer(0, "n1", ("10.0.0.1",), 1), reach.Peer(1, "n2", ("10.0.0.2",), 2),
             reach.Peer(2, "n2", ("10.0.0.2",), 3), reach.Peer(3, "n3", ("10.0.0.3",), 4)]
    guard = Watchdog(tmp_path, 0, 4, 10.0, peers=peers)
    for rank, beat in enumerate(["12 wait", "11 comm", "12 wait", "12 wait"]):
        (tmp_path / f"heartbeat-{rank:05d}").write_text(f"{beat} 0\n")
    survey = Survey(status={1: reach.UNREACHABLE, 2: reach.UNREACHABLE, 3: reach.REFUSED},
                    launcher=reach.ANSWERS)
    line = guard.describe(10.2, survey)
    assert line == (
        "syncbench: rank 0: no progress for 10 s (--timeout 10) in step 0; ranks that had "
        "not arrived: none (every rank is blocked in MPI); node n2 (ranks 1-2) cannot be "
        "reached from n1 (rank 0): a network fault; rank 3 on n3 ended (the node answers, "
        "the rank does not); aborting the job")


# -- on the emulated cluster ----------------------------------------------------------
@pytest.fixture(scope="module")
def cluster():
    with TC.up():
        yield NODES


def _ranks_in(node: str) -> list[int]:
    """Training ranks running inside ``node`` (found by namespace, not by name)."""
    pids = subprocess.run(["ip", "netns", "pids", node], capture_output=True,
                          text=True).stdout.split()
    found = []
    for pid in map(int, pids):
        try:
            words = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"syncbench" in b" ".join(words) and b"train" in words:
            found.append(pid)
    return found


def _set_link(node: str, state: str) -> None:
    link = TC.syncbench("cluster", "link", node, state)
    assert link.returncode == 0, link.stderr
    if state != "up":
        return
    # every node answers every other and the bridge again (a refused connect) before the
    # next job starts: a node that tried to reach the cut one holds a failed neighbour
    # entry for it, and a connect fails with "No route to host" until it is probed again
    addresses = [f"{SUBNET}.254"] + [f"{SUBNET}.{i}" for i in range(1, len(NODES) + 1)]
    check = ("import socket, sys\n"
             "for a in sys.argv[1:]:\n"
             "    s = socket.socket(); s.settimeout(1)\n"
             "    if s.connect_ex((a, 1)) != 111: raise SystemExit(1)\n")
    deadline = time.monotonic() + 10
    for each in NODES:
        while subprocess.run(["ip", "netns", "exec", each, sys.executable, "-c", check,
                              *addresses]).returncode:
            assert time.monotonic() < deadline, f"{each} does not reach every node after link up"
            time.sleep(0.2)


def _start(python: str, env: dict, tmp_path: Path) -> subprocess.Popen:
    """A 2-node SSGD run; returns once both ranks flushed rows (training is under way).

    Its output goes to a file: a pipe would stay open as long as the launcher's agent on
    a cut-off node lives."""
    log = (tmp_path / "job.log").open("w")
    proc = subprocess.Popen(
        [python, "-m", "syncbench", "cluster", "mpiexec", "-n", "2", "--", python, "-m",
         "syncbench", *TRAIN, "--out", str(tmp_path / "run.h5")],
        stdout=log, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
        env={**os.environ, **TC.env, **env})
    log.close()
    parts = tmp_path / "run.h5.parts"
    deadline = time.monotonic() + 60
    while not all((parts / f"rows-{r:05d}.bin").exists() for r in (0, 1)):
        if proc.poll() is not None or time.monotonic() > deadline:
            _cleanup(proc)
            pytest.fail(f"the run did not start training: {_log(tmp_path)}")
        time.sleep(0.1)
    time.sleep(1.0)  # some steps on both nodes
    return proc


def _log(tmp_path: Path) -> str:
    return (tmp_path / "job.log").read_text(errors="replace")


def _end(proc: subprocess.Popen, since: float, tmp_path: Path) -> tuple[float, str]:
    """Seconds from ``since`` until the job ended, and its output."""
    try:
        proc.wait(timeout=TIMEOUT_S + END_SLACK_S + 30)
    except subprocess.TimeoutExpired:
        _cleanup(proc)
        pytest.fail(f"the job did not end: {_log(tmp_path)}")
    return time.monotonic() - since, _log(tmp_path)


def _wait_ranks_gone(seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        left = [pid for node in NODES for pid in _ranks_in(node)]
        if not left:
            return []
        time.sleep(0.2)
    return left


def _cleanup(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for node in NODES:
        for pid in _ranks_in(node):
            os.kill(pid, signal.SIGKILL)


@pytest.mark.cluster
@pytest.mark.parametrize("python,env", launchers(slow_open_mpi=True))
def test_a_link_down_ends_the_job_naming_the_node_and_keeps_the_rows(cluster, tmp_path,
                                                                      python, env):
    proc = _start(python, env, tmp_path)
    try:
        _set_link(NODES[1], "down")
        elapsed, out = _end(proc, time.monotonic(), tmp_path)
        assert proc.returncode != 0, out
        assert elapsed < TIMEOUT_S + END_SLACK_S, (elapsed, out)
        assert "Traceback" not in out, out
        lines = [ln for ln in out.splitlines() if ln.startswith("syncbench")]
        assert len(lines) == 1, out
        assert f"node {NODES[1]} (rank 1) cannot be reached from {NODES[0]} (rank 0): " \
               "a network fault; aborting the job" in lines[0], out
        # the cut-off rank ended itself; its guard flushed its rows before
        assert _wait_ranks_gone(10) == []
    finally:
        _set_link(NODES[1], "up")
        _cleanup(proc)
    done = int(re.search(r" in step (\d+);", lines[0]).group(1))
    rec = subprocess.run([sys.executable, "-m", "syncbench", "recover",
                          str(tmp_path / "run.h5")], capture_output=True, text=True,
                         timeout=60)
    assert rec.returncode == 0, rec.stderr
    run = read_run(tmp_path / "run.h5")
    assert run.complete is False
    steps = {r: run.ranks[r]["step"] for r in (0, 1)}
    assert len(steps[0]) == done > 0
    assert abs(len(steps[1]) - done) <= 1
    for r in (0, 1):
        np.testing.assert_array_equal(steps[r], np.arange(len(steps[r])))


@pytest.mark.cluster
@pytest.mark.parametrize("python,env", launchers(slow_open_mpi=True))
def test_a_node_whose_ranks_are_killed_ends_the_job(cluster, tmp_path, python, env):
    proc = _start(python, env, tmp_path)
    try:
        victims = _ranks_in(NODES[1])
        assert victims
        killed = time.monotonic()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        elapsed, out = _end(proc, killed, tmp_path)
        assert proc.returncode != 0, out
        assert elapsed < END_SLACK_S, (elapsed, out)  # the launcher ends it: no guard needed
        assert "Traceback" not in out, out
        assert _wait_ranks_gone(10) == []
    finally:
        _cleanup(proc)
