"""The hang guard on a shared machine: its listener binds only the addresses it publishes
and answers only with the job's key, a process holding a dead rank's port is not taken for
the rank, a PID reused since the run started is not killed, heartbeat files are written
one at a time under unique names, and output files leave no temporary file behind."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from syncbench.bench.micro.comm import read_results, write_results
from syncbench.bench.mpi import reach
from syncbench.bench.mpi.watchdog import Survey, Watchdog, kill_if_same
from syncbench.bench.processes import Process

KEY = b"k" * 32


def _listening_on(port: int) -> set[str]:
    """Local IPv4 addresses with a socket listening on ``port`` (``/proc/net/tcp``)."""
    found = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        address, hex_port = fields[1].split(":")
        if int(hex_port, 16) == port and fields[3] == "0A":  # TCP_LISTEN
            found.add(socket.inet_ntoa(bytes.fromhex(address)[::-1]))
    return found


def test_the_listener_binds_what_it_publishes_and_loopback_never_every_address():
    listener = reach.Listener(reach.Identity(KEY, 0))
    try:
        bound = _listening_on(listener.port)
        assert "0.0.0.0" not in bound
        assert bound == {"127.0.0.1", *listener.addresses}
        assert set(listener.addresses) <= set(reach.local_addresses())
    finally:
        listener.close()
    assert _listening_on(listener.port) == set()  # closed when close() returns


def _guard(tmp_path: Path, ports: dict[int, int]) -> Watchdog:
    """Rank 0's guard of a job whose ranks all run on this host, listening on ``ports``."""
    peers = [reach.Peer(rank, "here", (), port) for rank, port in sorted(ports.items())]
    guard = Watchdog(None, 0, len(peers), 10.0, SimpleNamespace(current="comm"), peers=peers,
                     key=KEY)  # blocked in a collective
    guard.launcher = []  # no launcher to probe outside mpiexec
    return guard


def test_only_a_listener_with_the_jobs_key_and_its_rank_answers(tmp_path):
    live = reach.Listener(reach.Identity(KEY, 1), state=lambda: "7 comm")
    other_job = reach.Listener(reach.Identity(b"x" * 32, 2), state=lambda: "7 comm")
    try:
        # rank 3's port leads to rank 1's listener (a relay): the proof names rank 1
        guard = _guard(tmp_path, {0: 1, 1: live.port, 2: other_job.port, 3: live.port})
        survey = guard.survey([1, 2, 3])
    finally:
        live.close()
        other_job.close()
    assert survey.status == {1: reach.ANSWERS, 2: reach.REFUSED, 3: reach.REFUSED}
    assert survey.beats == {1: (7, "comm")}
    assert survey.answering([1]) and not survey.answering([2, 3])


def test_an_impostor_on_a_dead_ranks_port_is_not_taken_for_the_rank(tmp_path):
    """Rank 1 is gone; another process listens on its port. One never accepts (the
    kernel completes the connection), one accepts and closes, one answers garbage."""
    holds = socket.create_server(("127.0.0.1", 0))
    closes = socket.create_server(("127.0.0.1", 0))
    babbles = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve(server: socket.socket, reply: bytes) -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            conn.sendall(reply)
            conn.close()

    threads = [threading.Thread(target=serve, args=(closes, b"")),
               threading.Thread(target=serve, args=(babbles, os.urandom(40) + b"7 comm"))]
    for thread in threads:
        thread.start()
    try:
        for impostor in (holds, closes, babbles):
            guard = _guard(tmp_path, {0: 1, 1: impostor.getsockname()[1]})
            t0 = time.monotonic()
            survey = guard.survey([1])
            assert time.monotonic() - t0 < reach.PROBE_TIMEOUT_S + 1
            assert survey.status[1] != reach.ANSWERS, impostor
            assert not survey.answering([1]) and survey.beats == {}
            line = guard.describe(12.0, survey)
            assert "ranks that had not arrived: 1;" in line, line
            assert ("rank 1 on here ended" in line or "rank 1 on reachable nodes do not answer"
                    in line), line
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        for server in (holds, closes, babbles):
            server.close()


def test_a_client_that_says_nothing_does_not_keep_the_listener_from_answering():
    listener = reach.Listener(reach.Identity(KEY, 1), state=lambda: "3 wait")
    mute = [socket.create_connection(("127.0.0.1", listener.port)) for _ in range(5)]
    try:
        status, states = reach.probe_states({1: [("127.0.0.1", listener.port)]}, timeout=1.0,
                                            identities={1: reach.Identity(KEY, 1)})
    finally:
        for sock in mute:
            sock.close()
        listener.close()
    assert status == {1: reach.ANSWERS} and states == {1: "3 wait"}


# -- the kill of PRRTE's daemon -----------------------------------------------------
@pytest.fixture
def sleeper():
    proc = subprocess.Popen(["sleep", "60"])
    deadline = time.monotonic() + 5
    while Process.of(proc.pid).comm != "sleep":  # exec'd
        assert time.monotonic() < deadline
        time.sleep(0.01)
    yield proc
    proc.kill()
    proc.wait()


def test_a_pid_whose_name_or_start_time_changed_is_not_killed(sleeper):
    now = Process.of(sleeper.pid)
    assert now is not None and now.comm == "sleep"
    assert not kill_if_same(Process(now.pid, now.comm, now.start + 1))  # reused PID
    assert not kill_if_same(Process(now.pid, "prted", now.start))
    time.sleep(0.1)
    assert sleeper.poll() is None
    assert kill_if_same(now)  # the very process recorded
    assert sleeper.wait(timeout=5) == -9


@pytest.mark.parametrize("changed", ["start", "name"])
def test_the_guard_does_not_kill_a_reused_launcher_pid_and_says_so(sleeper, tmp_path, changed):
    """A network fault under Open MPI: the guard would kill its node's PRRTE daemon,
    recorded at the start; that PID now names another process (a ``sleep``)."""
    now = Process.of(sleeper.pid)
    recorded = (Process(now.pid, "prted", now.start) if changed == "name"
                else Process(now.pid, now.comm, now.start - 1))
    code = (
        "import sys\n"
        "from syncbench.bench.processes import Process\n"
        "from syncbench.bench.mpi.watchdog import Watchdog\n"
        "guard = Watchdog(None, 0, 1, 10.0)\n"
        f"guard.chain = [({now.pid}, 'prted')]\n"
        f"guard.daemon = Process({recorded.pid}, {recorded.comm!r}, {recorded.start})\n"
        "guard._end(network_fault=True)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path)
    assert proc.returncode == 3, proc.stderr[-2000:]
    time.sleep(0.1)
    assert sleeper.poll() is None, "the guard killed a process that is not PRRTE's daemon"
    assert f"PID {now.pid} is no longer the PRRTE daemon" in proc.stderr, proc.stderr


# -- heartbeat files and output files -----------------------------------------------
def test_heartbeats_from_the_main_thread_and_the_guards_never_collide(tmp_path):
    guard = Watchdog(tmp_path, 0, 1, 10.0, key=KEY)
    errors: list[BaseException] = []

    def main_thread() -> None:
        try:
            for step in range(200):
                guard.beat(step)
                guard._written = (-1, 0.0)  # due now
                guard._beat_file()
                guard._write(step, "step")
        except BaseException as exc:
            errors.append(exc)

    def guard_thread() -> None:
        try:
            for _ in range(200):
                guard._write(guard.step, "comm")  # what a timeout writes
        except BaseException as exc:
            errors.append(exc)

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        threads = [threading.Thread(target=main_thread), threading.Thread(target=guard_thread)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(switch)
    assert errors == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["heartbeat-00000"]
    # the main thread wrote 199 last; a guard's write that took the step before it says 199
    assert guard.heartbeats()[0][0] == 199


def test_a_heartbeat_written_with_an_older_step_does_not_set_the_file_back(tmp_path):
    """The guard's thread took ``step`` 3, the main thread then wrote 5: the guard's write
    (its phase) keeps 5, so the rank is not taken for one behind."""
    guard = Watchdog(tmp_path, 0, 1, 10.0, key=KEY)
    guard._write(5, "step")
    guard._write(3, "comm")
    assert guard.heartbeats()[0] == (5, "comm")


def test_a_guard_without_a_folder_writes_no_file_and_answers_its_progress(tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    guard = Watchdog(None, 0, 2, 10.0, key=KEY)
    guard.beat(5)
    guard._beat_file()
    guard._write(5, "comm")
    assert list(tmp_path.iterdir()) == []
    assert guard.state() == "5 -"
    assert guard.laggards(Survey(beats={1: (5, "comm")})) == [0]  # 0 is outside MPI


def test_comm_results_are_written_whole_or_not_at_all(tmp_path):
    """syncbench comm --out: a writer that fails leaves the previous file and no
    temporary one; each write replaces the file whole, mode 0644."""
    path = tmp_path / "comm.h5"
    path.write_text("before")
    with pytest.raises(ValueError):  # samples of unequal shapes: np.stack fails mid-build
        write_results(str(path), {"op": "allreduce"}, [{"bytes": 8.0}],
                      [np.zeros(2), np.zeros(3)])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comm.h5"]
    assert path.read_text() == "before"
    for value in (1.0, 2.0):
        write_results(str(path), {"op": "allreduce"}, [{"bytes": value}], [np.zeros((2, 3))])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["comm.h5"]
    results = read_results(str(path))
    assert results["attrs"]["op"] == "allreduce" and list(results["bytes"]) == [2.0]
    assert results["samples_us"].shape == (1, 2, 3)
    assert (path.stat().st_mode & 0o777) == 0o644
