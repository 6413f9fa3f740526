"""The quota probe's check (``bench/cluster/cpu.py``): the kernel's throttling told from
other work's preemption, and the ``cpu.stat`` that counts the quota's throttled time
found beside the node's cgroups (the script itself: tests/e2e/test_cluster_probe_e2e.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from syncbench.bench.cluster import cpu


def test_preempted_means_frozen_longer_by_the_clock_than_by_the_kernel():
    # measured: quiet 358 ms by the clock against 355 throttled; a competing spin 401
    # against 206; a 2 ms-on, 3 ms-off competitor 343 against 196
    assert not cpu._preempted(0.358, 0.355)
    assert cpu._preempted(0.401, 0.206) and cpu._preempted(0.343, 0.196)
    limit = 0.355 * (1 + cpu.PREEMPTED_SHARE) + cpu.PREEMPTED_S
    assert not cpu._preempted(limit, 0.355) and cpu._preempted(limit + 1e-4, 0.355)
    assert cpu._frozen("0.401,0.206") == (0.401, 0.206)
    assert cpu._frozen("") is None and cpu._frozen("x,y") is None


@pytest.mark.parametrize("field", ["throttled_time 5", "throttled_usec 5"])
def test_the_cpu_stat_with_the_quotas_throttled_time_is_the_one_read(tmp_path, field):
    (tmp_path / "cpuset").mkdir()
    (tmp_path / "cpuset" / "cpu.stat").write_text("usage 1\n")  # no throttling counted
    (tmp_path / "cpu.stat").write_text(f"nr_periods 1\n{field}\n")
    node = SimpleNamespace(cgroup_procs=[str(tmp_path / "cpuset" / "cgroup.procs"),
                                         str(tmp_path / "cgroup.procs")])
    assert cpu.throttle_stat(node) == str(tmp_path / "cpu.stat")
    assert cpu.throttle_stat(SimpleNamespace(cgroup_procs=[str(tmp_path / "no" / "x")])) == ""


def test_the_throttled_seconds_of_either_cgroup_version():
    """One reading of a ``cpu.stat``'s throttled time for the host-side reader
    (``quota_collective``) and the in-node one (``quota_wakes``)."""
    assert cpu.throttled_seconds("nr_periods 4\nthrottled_time 2500000\n") == 0.0025
    assert cpu.throttled_seconds("nr_throttled 1\nthrottled_usec 2500\n") == 0.0025
    assert cpu.throttled_seconds("usage_usec 10\n") is None
    assert cpu.throttled_seconds("throttled_time x\n") is None
