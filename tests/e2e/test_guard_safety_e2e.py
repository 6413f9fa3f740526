"""The hang guard on a shared machine: its listener binds only the addresses it publishes
and answers only with the job's key, a process holding a dead rank's port is not taken for
the rank, a PID reused since the run started is not killed, heartbeat files are written
one at a time under unique names, and output files leave no temporary file behind.

Here, the tests that launch a process (``mpiexec``, a ``syncbench`` command) or start MPI in
the test's own process; the rest are in ``tests/unit/test_guard_safety.py``.
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from syncbench.bench.mpi.watchdog import kill_if_same
from syncbench.bench.processes import Process


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
