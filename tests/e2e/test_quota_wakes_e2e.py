"""``python -m syncbench.bench.micro.quota_wakes`` off a quota (this host's test process):
its bad input and its table. What it measures at a quota is checked on the emulated
cluster (``tests/e2e/test_cluster.py``)."""

from __future__ import annotations

import subprocess
import sys

import pytest


def _quota_wakes(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "syncbench.bench.micro.quota_wakes", *args],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("flags,named", [
    (["--wake-ms", "-1"], "--wake-ms"),
    (["--wake-ms", "1,x"], "--wake-ms"),
    (["--wake-ms", "nan"], "--wake-ms"),
    (["--wake-ms", ","], "--wake-ms"),
    (["--wake-ms", "1e9"], "--wake-ms"),
    (["--seconds", "0"], "--seconds"),
    (["--seconds", "nan"], "--seconds"),
    (["--seconds", "x"], "--seconds"),
    (["--repeats", "0"], "--repeats"),
    (["--repeats", "1e3"], "--repeats"),
    (["--waker", "no"], "--waker"),
    (["--waker", "send", "--send-to", "nohost"], "--send-to"),
    (["--waker", "send", "--send-to", "::1:9"], "--send-to"),
    (["--waker", "send", "--send-to", "host:\u00b2"], "--send-to"),
    (["--bogus"], "unknown arguments"),
])
def test_bad_input_is_one_line(flags, named):
    done = _quota_wakes(*flags)
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.count("\n") == 1 and named in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.alone  # a spin: not beside another test worker
@pytest.mark.parametrize("waker", ["sleep", "send", "cpuclock"])
def test_a_row_per_interval_with_the_wakes_made_during_the_spin(waker):
    """A row per interval; the waker's rate during the spin is counted, near what was asked
    (a sleep of 2 ms wakes at most 500 times a second, a send every 2 ms as often)."""
    done = _quota_wakes("--wake-ms", "0,2", "--seconds", "0.2", "--repeats", "2",
                        "--waker", waker)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines()
            if line.strip() and not line.startswith("#") and line.split()[0] != "wake"]
    assert [row[0] for row in rows] == ["none", "2"], done.stdout
    assert rows[0][-1] == "-"
    rate = float(rows[1][-2])
    assert 100 < rate <= 510, done.stdout
    own_cpu = float(rows[0][3])  # the spin alone, no quota: on the CPU most of its wall
    assert 0.5 < own_cpu <= 1.01, done.stdout
