"""Nodes' CPUs: a CPU set per node when the host has cores enough, a CFS quota for slow ones.

A node of speed F gets ``cpu.cfs_quota_us = F x (its CPUs) x cpu.cfs_period_us``
(cgroup v1; ``cpu.max`` under cgroup v2): the kernel lets its processes run F
of each period, so a node 0.25 computes at a quarter of its core(s) whatever
the suite does. CFS enforces the quota per period (the kernel's
Documentation/scheduler/sched-bwc.rst), so a step much shorter than the period
runs at full speed until the quota is spent and then stalls, inside MPI too:
the slowdown comes in bursts, not evenly (measured in docs/CLUSTER.md). The
period defaults to the shortest the kernel allows (a quota of at least 1 ms:
4 ms at speed 0.25), the finest grain it offers.
"""

from __future__ import annotations

import math
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

from .host import ClusterError
from .state import Cluster, Node, record, save

CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_version() -> int:
    """1 where the v1 ``cpu`` controller is mounted, 2 on a unified hierarchy, else 0."""
    if (CGROUP_ROOT / "cpu" / "cpu.cfs_quota_us").exists():
        return 1
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return 2
    return 0


def host_cpus() -> list[int]:
    """The CPUs this process may use (what the nodes divide between them)."""
    return sorted(os.sched_getaffinity(0))


def plan_cpusets(count: int, cpus: list[int] | None = None) -> list[str]:
    """One CPU list per node: disjoint ones when there are at least as many CPUs as nodes;
    when the nodes are a whole multiple k of the CPUs, k consecutive nodes to each CPU
    (nodes 1 and 2 on the first of two CPUs, 3 and 4 on the second), so that each node
    shares one known core with k - 1 others and ``--node-speed 1/k`` on every node gives
    each a fixed share of it; else none (the nodes share every CPU)."""
    cpus = host_cpus() if cpus is None else cpus
    if not cpus:
        return [""] * count
    if len(cpus) < count:
        if count % len(cpus):
            return [""] * count
        per_cpu = count // len(cpus)
        return [str(cpus[i // per_cpu]) for i in range(count)]
    share = len(cpus) // count
    return [",".join(map(str, cpus[i * share:(i + 1) * share])) for i in range(count)]


def nodes_per_cpu(cpusets: list[str]) -> int:
    """How many nodes the most shared CPU of ``cpusets`` holds (1: none is shared; 0:
    the nodes have no CPU sets)."""
    counts: dict[str, int] = {}
    for cpus in cpusets:
        for one in filter(None, cpus.split(",")):
            counts[one] = counts.get(one, 0) + 1
    return max(counts.values(), default=0)


def _write(path: Path, value: str, what: str) -> None:
    try:
        path.write_text(value)
    except OSError as exc:
        raise ClusterError(f"{what}: cannot write {value!r} to {path}: {exc.strerror}") from exc


def cgroup_inode(path: str | Path) -> int | None:
    """A cgroup folder's inode (with its path, its identity), or None if it is gone."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    return st.st_ino if stat.S_ISDIR(st.st_mode) else None


def made_here(cluster: Cluster, path: Path) -> bool:
    """Whether the cgroup at ``path`` is one this cluster made (path and inode recorded)."""
    inode = cgroup_inode(path)
    return inode is not None and any(
        o.get("kind") == "cgroup" and o.get("name") == str(path) and o.get("inode") == inode
        for o in cluster.made)


def _mkdir(cluster: Cluster, path: Path) -> None:
    if os.path.lexists(path):
        raise ClusterError(f"cgroup {path} already exists and syncbench cluster did not make it")
    try:
        path.mkdir()
    except OSError as exc:
        raise ClusterError(f"cannot create cgroup {path}: {exc.strerror}") from exc
    record(cluster, "cgroup", str(path), inode=cgroup_inode(path))


def make_cgroups(cluster: Cluster, node: Node) -> None:
    """The node's cgroup(s); fills ``node.cgroup_procs``. Nothing when nothing is asked."""
    if not node.cpus and node.speed >= 1.0:
        return
    version = _controller("--node-speed")
    quota = _quota_us(node, node.speed, cluster.cpu_period_us)
    if version == 1:
        _v1(cluster, node, quota, cluster.cpu_period_us)
    else:
        _v2(cluster, node, quota, cluster.cpu_period_us)
    node.throttle = measured_pattern(cluster, node) if node.speed < 1.0 else ""


#: Seconds the probe of a node's quota spins, and the gap between two of its clock
#: readings that is the process frozen (a reading takes well under a microsecond).
THROTTLE_PROBE_S = 0.6
FROZEN_GAP_S = 3e-4
#: First bursts the probe samples, each after :data:`IDLE_S` asleep: long enough for the
#: debt of the burst before to be paid and for the quota's period timer to stop, so that
#: each burst starts at a new phase of the period against the tick.
FIRST_BURSTS = 30
IDLE_S = 0.012
#: Seconds beyond its spin the probe may take to start and report before it is killed.
PROBE_GRACE_S = 30.0
#: Probes of one quota before it is left unmeasured: a probe the node's CPU was taken
#: from by other work is run again (:func:`throttle_pattern`).
PROBE_TRIES = 3
#: How far the spin's frozen time by its clock may exceed the kernel's throttled time
#: (the cgroup's ``cpu.stat``) before the probe counts as preempted: a share of the
#: kernel's, and seconds.
PREEMPTED_SHARE, PREEMPTED_S = 0.05, 2e-3
#: Seconds between two tries: a burst of other work (a run's ranks exiting) can pass.
PROBE_PAUSE_S = 0.3
#: The probe: wait for the go (its parent has put it in the node's cgroups by then), spin
#: on a clock that makes no system call, print each running span and each frozen one;
#: then, :data:`FIRST_BURSTS` times, sleep :data:`IDLE_S` and spin until frozen, and print
#: how long each of those first bursts ran; last, the spin's frozen seconds by its clock
#: and by the kernel (the throttled time of the cgroup's ``cpu.stat``, read at the spin's
#: two ends; nothing where the file was not given).
_PROBE = """
import sys, time
sys.stdin.readline()
def throttled():
    if not {stat!r}:
        return None
    try:
        fields = dict(line.split()[:2] for line in open({stat!r}) if line.strip())
        if "throttled_usec" in fields:
            return int(fields["throttled_usec"]) * 1e-6
        return int(fields["throttled_time"]) * 1e-9
    except (OSError, ValueError, KeyError):
        return None
kernel_before = throttled()
clock = time.perf_counter
start = last = begin = clock()
spans = []
while last - start < {duration}:
    now = clock()
    if now - last > {gap}:
        spans.append((last - begin, now - last))
        begin = now
    last = now
kernel_after = throttled()
print(" ".join(f"{{on:.6f}},{{off:.6f}}" for on, off in spans))
firsts = []
for _ in range({firsts}):
    time.sleep({idle})
    begin = last = clock()
    while last - begin < 0.1:
        now = clock()
        if now - last > {gap}:
            break
        last = now
    firsts.append(last - begin)
print(" ".join(f"{{first:.6f}}" for first in firsts))
if kernel_before is not None and kernel_after is not None:
    print(f"{{sum(off for _, off in spans):.6f}},{{kernel_after - kernel_before:.6f}}")
"""


def throttle_pattern(node: Node) -> str:
    """How the kernel realises the node's quota: ``ON/OFF/FIRST10-FIRST90``, the median
    milliseconds a process that never idles runs, then is frozen, and the 10th and 90th
    percentiles of how long a process runs after an idle spell before it is frozen the
    first time, measured by a process inside the node's cgroups (:data:`THROTTLE_PROBE_S`
    of spinning, then :data:`FIRST_BURSTS` sleeps each followed by a spin). "" when it saw
    fewer than three spans, as at speeds of about 0.05 and below, or when the node has no
    cgroup or more than one CPU: one spinning process cannot use a quota of several.

    CFS charges the quota at the scheduler tick (``CONFIG_HZ``), not as it is spent, so a
    process that makes no system call overruns it to the next tick and is then frozen
    until the next periods have paid the debt: at speed 0.5 (1 ms every 2 ms) on a
    250 Hz kernel it ran 3.1 ms and was frozen 4.9 ms, a share of 0.39 (docs/CLUSTER.md).
    The first burst after an idle spell is not that run: where the tick falls against the
    period's refill varies from one wake to the next, so it spread from about 2 to 5 ms
    (10th to 90th percentile: 1.8-5.0, 2.2-4.4 and 2.7-5.2 ms in three settings of that
    quota) and an MPI rank's compute after a wait in MPI ran about as long
    before its first freeze (docs/RESULTS.md, "A quota's first burst"). Where fewer than
    three first bursts come back, the pattern is ``ON/OFF`` alone.

    Other work on the node's CPU cuts the probe's runs short and adds stops of its own
    to its freezes: the probe is run again where its spin was frozen longer by its clock
    than the kernel throttled it (:func:`_preempted`), up to :data:`PROBE_TRIES` times,
    and a :class:`ClusterError` says so after the last (the quota stands; the pattern is
    left unmeasured, :func:`measured_pattern`). In 144 runs at a quota of the simulator's
    validation measured before this check, on a host other work loaded during them, 38
    recorded patterns of 0.9-2.7 ms on and 1.1-3.1 off, the other 106 2.7-2.9 and 3.1-3.2;
    a quiet host's probe gives 3.2 and 4.8.

    The simulator's validation takes a run's pattern from the rank attributes
    ``node_throttle_on_s``, ``node_throttle_off_s``, ``node_throttle_first_lo_s`` and
    ``node_throttle_first_hi_s`` that ``$SYNCBENCH_NODE_THROTTLE`` carries to the
    ranks."""
    if not node.cgroup_procs or node.cpu_count != 1:
        return ""  # no quota to measure, or one a single spinning process cannot fill
    stat = throttle_stat(node)
    checks = []
    for attempt in range(PROBE_TRIES):
        if attempt:
            time.sleep(PROBE_PAUSE_S)
        lines = _probe(node, stat)
        check = _frozen(lines[2])
        if check is None or not _preempted(*check):
            return _pattern(lines)
        checks.append(f"{1e3 * check[0]:.0f}/{1e3 * check[1]:.0f}")
    raise ClusterError(f"the quota probe of {node.name} was preempted in each of "
                       f"{PROBE_TRIES} tries (ms frozen by its clock/by the kernel's "
                       f"throttling: {', '.join(checks)}): other work shares the node's "
                       f"CPU {node.cpus or '(no CPU set of its own)'}")


def throttled_seconds(text: str) -> float | None:
    """The throttled seconds a cgroup's ``cpu.stat`` text holds (v1 ``throttled_time`` in
    ns, v2 ``throttled_usec``), or None where it holds neither or no number."""
    try:
        fields = dict(line.split()[:2] for line in text.splitlines() if line.strip())
        if "throttled_usec" in fields:
            return int(fields["throttled_usec"]) * 1e-6
        return int(fields["throttled_time"]) * 1e-9
    except (ValueError, KeyError):
        return None


def throttle_stat(node: Node) -> str:
    """The ``cpu.stat`` beside one of the node's ``cgroup.procs`` whose quota's throttled
    time it counts (v1 ``throttled_time``, v2 ``throttled_usec``); "" where none does."""
    for procs in node.cgroup_procs:
        stat = Path(procs).with_name("cpu.stat")
        try:
            text = stat.read_text()
        except OSError:
            continue
        if "throttled_time" in text or "throttled_usec" in text:
            return str(stat)
    return ""


def _probe(node: Node, stat: str) -> list[str]:
    """One run of :data:`_PROBE` inside the node's cgroups: its three lines ("" for any it
    did not print)."""
    probe = _PROBE.format(duration=THROTTLE_PROBE_S, gap=FROZEN_GAP_S, firsts=FIRST_BURSTS,
                          idle=IDLE_S, stat=stat)
    try:
        child = subprocess.Popen([sys.executable, "-I", "-c", probe], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    except OSError as exc:
        raise ClusterError(f"cannot start the quota probe of {node.name}: {exc.strerror}") \
            from exc
    try:
        for procs in node.cgroup_procs:
            _write(Path(procs), str(child.pid), f"the quota probe into {node.name}")
        out, _ = child.communicate("go\n", timeout=THROTTLE_PROBE_S + FIRST_BURSTS * 0.2
                                   + PROBE_GRACE_S)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        raise ClusterError(f"the quota probe of {node.name} did not finish in "
                           f"{THROTTLE_PROBE_S + PROBE_GRACE_S:g} s") from None
    except ClusterError:
        child.kill()
        child.wait()
        raise
    return (out.splitlines() + ["", "", ""])[:3]


def _frozen(check: str) -> tuple[float, float] | None:
    """The probe's third line, ``CLOCK,KERNEL``: seconds its spin was frozen by its own
    clock and throttled by the kernel; None where the kernel's was not read."""
    try:
        clock_s, kernel_s = (float(v) for v in check.split(","))
    except ValueError:
        return None
    return clock_s, kernel_s


def _preempted(clock_s: float, kernel_s: float) -> bool:
    """Whether the probe's spin was frozen longer by its clock than the kernel throttled
    it: then other work took the CPU from it, and its spans are that work's as much as
    the quota's. Measured with a competing spin pinned to the node's CPU: frozen 401 ms by
    the clock against 206 by the kernel (the pattern 3.98/8.02 ms against 3.21/4.79
    alone, where it was 358 against 355); with a 2 ms-on, 3 ms-off competitor, 343
    against 196 (2.89/2.18)."""
    return clock_s > kernel_s * (1.0 + PREEMPTED_SHARE) + PREEMPTED_S


def _pattern(lines: list[str]) -> str:
    """``ON/OFF[/LO-HI]`` of the probe's first two lines (:func:`throttle_pattern`)."""
    spans = [tuple(float(v) for v in pair.split(",")) for pair in lines[0].split()][1:-1]
    if len(spans) < 3:  # the first and the last span are cut by the probe's ends
        return ""
    on = sorted(s[0] for s in spans)[len(spans) // 2]
    off = sorted(s[1] for s in spans)[len(spans) // 2]
    pattern = f"{1e3 * on:.3f}/{1e3 * off:.3f}"
    firsts = sorted(float(v) for v in lines[1].split())
    if len(firsts) < 3:
        return pattern
    low, high = (firsts[round(q * (len(firsts) - 1))] for q in (0.1, 0.9))
    return f"{pattern}/{1e3 * low:.3f}-{1e3 * high:.3f}"


def _v1(cluster: Cluster, node: Node, quota: int, period: int) -> None:
    if node.cpus and (CGROUP_ROOT / "cpuset").is_dir():
        group = CGROUP_ROOT / "cpuset" / node.name
        _mkdir(cluster, group)
        mems = (CGROUP_ROOT / "cpuset" / "cpuset.mems").read_text().strip()
        _write(group / "cpuset.cpus", node.cpus, f"CPU set of {node.name}")
        _write(group / "cpuset.mems", mems, f"memory nodes of {node.name}")
        node.cgroup_procs.append(str(group / "cgroup.procs"))
    if quota > 0:
        group = CGROUP_ROOT / "cpu" / node.name
        _mkdir(cluster, group)
        _write_quota(1, group, node, quota, period)
        node.cgroup_procs.append(str(group / "cgroup.procs"))


def _v2(cluster: Cluster, node: Node, quota: int, period: int) -> None:
    group = CGROUP_ROOT / node.name
    _mkdir(cluster, group)
    if node.cpus:
        _write(group / "cpuset.cpus", node.cpus, f"CPU set of {node.name}")
    if quota > 0:
        _write_quota(2, group, node, quota, period)
    node.cgroup_procs.append(str(group / "cgroup.procs"))


def _controller(what: str) -> int:
    """The cgroup version whose cpu controller is mounted (one-line error if none)."""
    version = cgroup_version()
    if version == 0:
        raise ClusterError(f"no cgroup cpu controller mounted at /sys/fs/cgroup: {what} "
                           "needs one (cgroup v1 cpu or cgroup v2)")
    return version


def _quota_us(node: Node, speed: float, period: int) -> int:
    """``speed`` x the node's CPUs x ``period`` (-1: no quota at speed 1)."""
    return int(speed * node.cpu_count * period) if speed < 1.0 else -1


def _write_quota(version: int, group: Path, node: Node, quota: int, period: int) -> None:
    """Write a quota (-1: none) and its period. v1 lifts the old quota first: the kernel
    refuses a period under which the current quota no longer fits."""
    if version == 1:
        _write(group / "cpu.cfs_quota_us", "-1", f"CPU quota of {node.name}")
        _write(group / "cpu.cfs_period_us", str(period), f"CPU period of {node.name}")
        _write(group / "cpu.cfs_quota_us", str(quota), f"CPU quota of {node.name}")
    else:
        _write(group / "cpu.max", f"{quota if quota > 0 else 'max'} {period}",
               f"CPU quota of {node.name}")


def period_for(cluster: Cluster, speed: float) -> int:
    """The CFS period (us) of a node of ``speed``: the cluster's, lengthened where the
    quota would fall under the kernel's 1 ms minimum (``up``'s rule, 1 ms / speed)."""
    shortest = math.ceil(1000.0 / speed) if speed < 1.0 else 0
    return max(cluster.cpu_period_us, shortest)


def set_speed(cluster: Cluster, node: Node, speed: float) -> None:
    """Give a node of a running cluster a new speed, live (``syncbench cluster speed``).

    The quota is written into the node's ``cpu`` cgroup, made (and recorded)
    now if ``up`` gave the node none; speed 1 lifts the quota (``-1``, v2
    ``max``). Processes already inside the node are throttled from the next
    period on; the launcher shim is rewritten so that ranks started from now
    on read the new ``$SYNCBENCH_NODE_SPEED``. ``syncbench run`` sets the
    speeds of each configuration this way (a scenario's ``node_speeds``).
    ``cluster`` is the state read under its lock (``state.changing``); a cgroup of
    the node's name that this cluster did not make is refused, never written.
    """
    if not 0.01 <= speed <= 1.0:
        raise ClusterError(f"node speed {speed:g}: must be in [0.01, 1]")
    version = _controller("a node speed")
    group = (CGROUP_ROOT / "cpu" / node.name) if version == 1 else (CGROUP_ROOT / node.name)
    procs = str(group / "cgroup.procs")
    if os.path.lexists(group) and not made_here(cluster, group):
        raise ClusterError(f"cgroup {group} exists and syncbench cluster did not make it "
                           "(or it was made again since 'up'): its quota is left alone")
    if not group.is_dir():
        if speed >= 1.0:
            node.speed, node.throttle = 1.0, ""
            save(cluster)
            return
        _mkdir(cluster, group)
        if procs not in node.cgroup_procs:
            node.cgroup_procs.append(procs)
    period = period_for(cluster, speed)
    _write_quota(version, group, node, _quota_us(node, speed, period), period)
    node.speed = float(speed)
    node.throttle = ""
    save(cluster)  # the quota is the kernel's now; its pattern is a measurement of it
    if speed < 1.0:
        node.throttle = measured_pattern(cluster, node)
        save(cluster)


def measured_pattern(cluster: Cluster, node: Node) -> str:
    """:func:`throttle_pattern`, or "" with a note in the state and one line on stderr
    where the probe failed (a measurement: the quota stands without it)."""
    stale = f"{node.name}: its quota's bursts were not measured"
    cluster.notes = [n for n in cluster.notes if not n.startswith(stale)]
    try:
        return throttle_pattern(node)
    except ClusterError as err:
        note = f"{stale}: {err}"
        cluster.notes.append(note)
        print(f"syncbench cluster: note: {note}", file=sys.stderr)
        return ""


def remove_cgroup(path: str) -> None:
    """Remove a made cgroup (the caller checked its identity); its remaining processes move
    to the parent first."""
    group = Path(path)
    if CGROUP_ROOT not in group.parents or not group.is_dir() or group.is_symlink():
        return
    parent = group.parent / "cgroup.procs"
    try:
        for pid in (group / "cgroup.procs").read_text().split():
            try:
                parent.write_text(pid)
            except OSError:
                pass
        group.rmdir()
    except OSError as exc:
        raise ClusterError(f"cannot remove cgroup {group}: {exc.strerror}") from exc
