"""Faults only a network brings: the hang guard's probes (no root) and, on the emulated
cluster (``syncbench cluster``, as root, marked ``cluster``), a link taken down and a
node's ranks killed in the middle of a run, under MPICH and Open MPI.

The cluster tests bring up their own 2-node cluster (prefix ``tf``, subnet 10.81.0,
links unshaped) and take it down at the end. Without root (or ``ip``/``unshare``) they
skip, unless ``SYNCBENCH_REQUIRE_CLUSTER=1`` (``make test-cluster``) makes that a failure.
A node's ranks are found through ``ip netns pids`` (a node is a network namespace only:
``pkill`` inside it would see, and kill, every process of the host).

Here, the tests that launch a process (``mpiexec``, a ``syncbench`` command) or start MPI in
the test's own process; the rest are in ``tests/unit/test_network_faults.py``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from cluster_helpers import TestCluster, launchers

from syncbench.analysis.runfile import read_run

TC = TestCluster("tf", "10.81.0")


SUBNET = TC.subnet


NODES = TC.nodes


#: The runs' hang guard; a job must end within it and :data:`END_SLACK_S`.
TIMEOUT_S = 5


END_SLACK_S = 8


TRAIN = ["train", "--algorithm", "ssgd", "--model", "mlp", "--dataset", "synthetic",
         "--epochs", "1000", "--eval-every", "0", "--progress", "never",
         "--timeout", str(TIMEOUT_S), "--flush-every", "0.2"]


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
    # both ends answer again (a refused connect) before the next job starts
    check = (f"import socket; s = socket.socket(); s.settimeout(1); "
             f"raise SystemExit(s.connect_ex(('{SUBNET}.254', 1)) not in (111,))")
    deadline = time.monotonic() + 10
    while subprocess.run(["ip", "netns", "exec", node, sys.executable, "-c", check]).returncode:
        assert time.monotonic() < deadline, f"{node} does not reach the bridge after link up"
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
@pytest.mark.parametrize("python,env", launchers())
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
@pytest.mark.parametrize("python,env", launchers())
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
