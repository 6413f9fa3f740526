"""bench/files.py: whole-or-nothing writes under unpredictable names, and the flock that
keeps two processes off one path.

Split off ``tests/unit/test_files.py``: the tests that launch a process (``mpiexec``, a
``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from syncbench.bench.files import ExclusiveLock, LockHeld


def test_lock_refuses_a_second_holder_naming_the_first(tmp_path):
    path = tmp_path / "run.lock"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from syncbench.bench.files import ExclusiveLock as L; "
         f"L({str(path)!r}, 'x').acquire(); print('held', flush=True); time.sleep(60)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(LockHeld) as info:
            ExclusiveLock(path, "run file r.h5").acquire()
        line = str(info.value)
        assert "\n" not in line and line.startswith("run file r.h5 is in use")
        assert f"pid {holder.pid}" in line
    finally:
        holder.kill()
        holder.wait()
    # the kernel dropped the dead holder's lock: no stale lock to clean by hand
    with ExclusiveLock(path, "x") as lock:
        assert lock.held
    assert not path.exists()
