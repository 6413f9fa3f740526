"""The quota probe's script (``bench/cluster/cpu.py``'s ``_PROBE``) run without a cgroup,
on a stand-in ``cpu.stat`` of either cgroup version: the kernel's throttled time read at
the spin's two ends, and a file it cannot read leaving the check out, not the pattern."""

from __future__ import annotations

import subprocess
import sys

import pytest

from syncbench.bench.cluster import cpu


def _probe_lines(stat: str) -> list[str]:
    script = cpu._PROBE.format(duration=0.05, gap=cpu.FROZEN_GAP_S, firsts=3, idle=0.001,
                               stat=stat)
    done = subprocess.run([sys.executable, "-I", "-c", script], input="go\n",
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return (done.stdout.splitlines() + ["", "", ""])[:3]


@pytest.mark.parametrize("text", [
    "nr_periods 10\nnr_throttled 4\nthrottled_time 5000000\n",  # v1: nanoseconds
    "usage_usec 9\nnr_periods 10\nnr_throttled 4\nthrottled_usec 5000\n",  # v2: microseconds
])
def test_the_probe_reads_the_kernels_throttled_time_of_either_version(tmp_path, text):
    stat = tmp_path / "cpu.stat"
    stat.write_text(text)
    frozen = cpu._frozen(_probe_lines(str(stat))[2])
    assert frozen is not None and frozen[1] == 0.0  # the file did not move: none throttled


def test_a_cpu_stat_the_probe_cannot_read_leaves_the_check_out_not_the_pattern(tmp_path):
    stat = tmp_path / "cpu.stat"
    stat.write_text("throttled_time many\n")
    lines = _probe_lines(str(stat))
    assert lines[1].count(".") == 3  # the three first bursts still come back
    assert lines[2] == "" and cpu._frozen(lines[2]) is None
    assert _probe_lines("")[2] == ""  # no file given: no check line
