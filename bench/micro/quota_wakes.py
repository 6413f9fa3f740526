"""How much of a CPU quota a busy process gets when another task on its CPU wakes now and then.

A node at a CPU quota (``syncbench cluster up --node-speed``) is throttled by CFS
bandwidth control. The kernel checks the quota when the scheduler runs: at the tick
(``CONFIG_HZ``: every 4 ms at 250 Hz) and at any wake-up, sleep or preemption on the CPU
(``update_curr`` in ``kernel/sched/fair.c``; Documentation/scheduler/sched-bwc.rst). A
process alone on the CPU that makes no system call overruns its quota to the next tick
and is then frozen until the periods after have paid the debt. The cluster's probe
measures that pattern (:func:`syncbench.bench.cluster.cpu.throttle_pattern`), and the
simulator's quota model starts from it (:class:`syncbench.bench.simulate.quota.Throttle`).

A task that wakes on the same CPU makes the scheduler run between ticks, so the overrun,
and the freeze that pays it, are shorter. This measures how much that changes the share
of wall time a busy process runs. For each interval of ``--wake-ms`` (0: none), this
process spins on a clock for ``--seconds`` beside one of two ``--waker`` kinds:

- ``sleep``: a child process in the same cgroups sleeps the interval in a loop, so it
  wakes on the CPU each time;
- ``send``: the spin itself sends a 1 KB UDP datagram to ``--send-to`` each interval (a
  system call through the network stack on this CPU, as an MPI rank's sends are; no
  task wakes).

Each gap of more than 0.3 ms between two clock readings is a freeze (as in the cluster's
probe), a send's own time included. It prints, per interval, the median and range over
``--repeats`` of:

- the running share: the spin's wall not frozen, over its wall;
- the median running and frozen span;
- the share of wall the kernel counted the cgroup throttled (``cpu.stat``; not readable
  inside a node, whose sysfs is its own);
- the wakes (or sends) per second.

The intervals run in a random order within each repeat. Run it inside a node::

    syncbench cluster up --nodes 2 --node-speed 1,0.5
    syncbench cluster exec sbnode2 -- python -m syncbench.bench.micro.quota_wakes
    syncbench cluster exec sbnode2 -- python -m syncbench.bench.micro.quota_wakes \\
        --waker send --send-to 10.77.0.1:9

Figures: docs/RESULTS.md, "A quota's share and the wake-ups on its CPU".
"""

from __future__ import annotations

import argparse
import math
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

#: Clock gap that counts as the process frozen (a reading takes well under a microsecond).
FROZEN_GAP_S = 3e-4
#: Seconds the waker runs before the spin starts, and past its end.
SETTLE_S = 0.1
WAKERS = ("sleep", "send")
#: Bytes of each datagram of ``--waker send``.
DATAGRAM_BYTES = 1024
#: The waker: sleep the interval in a loop until the deadline, then print its wake count.
_WAKER = """
import sys, time
interval, deadline = float(sys.argv[1]), time.monotonic() + float(sys.argv[2])
wakes = 0
while time.monotonic() < deadline:
    time.sleep(interval)
    wakes += 1
print(wakes)
"""


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="quota_wakes", description=__doc__.splitlines()[0])
    parser.add_argument("--wake-ms", default="0,0.5,1,2,4,8",
                        help="the waker's sleep in ms, comma-separated (0: no waker)")
    parser.add_argument("--seconds", type=float, default=1.0,
                        help="seconds each spin runs (default 1)")
    parser.add_argument("--repeats", type=int, default=5,
                        help="spins per interval (default 5)")
    parser.add_argument("--waker", default="sleep", choices=WAKERS,
                        help="sleep: a child process wakes each interval; send: the spin "
                        "sends a UDP datagram each interval (default sleep)")
    parser.add_argument("--send-to", default="127.0.0.1:9", metavar="HOST:PORT",
                        help="where --waker send sends (default 127.0.0.1:9, discard)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the order")
    return parser.parse_args(argv)


def intervals(text: str) -> list[float]:
    """Milliseconds of ``--wake-ms``: each finite and >= 0; ValueError otherwise."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"--wake-ms {text!r}: give milliseconds, comma-separated") from None
    if not values or not all(math.isfinite(v) and v >= 0 for v in values):
        raise ValueError(f"--wake-ms {text!r}: each interval must be a number >= 0 ms")
    return values


#: Where the cgroup file systems are mounted. Inside a node they are not: ``ip netns exec``
#: mounts a sysfs of the node's own, so there the kernel's column stays empty.
CGROUP_ROOT = Path("/sys/fs/cgroup")


def cgroup_files() -> tuple[Path | None, float | None]:
    """(this process's ``cpu.stat`` that counts throttled time, the nominal share its
    quota gives: quota over period; None for either where there is none or it cannot be
    read)."""
    try:
        lines = [line.split(":", 2) for line in
                 Path("/proc/self/cgroup").read_text().splitlines()]
        for _, controllers, path in lines:
            if "cpu" in controllers.split(","):
                for name in ("cpu", "cpu,cpuacct"):
                    base = CGROUP_ROOT / name / path.lstrip("/")
                    if (base / "cpu.stat").exists():
                        return _v1(base)
        for _, controllers, path in lines:
            base = CGROUP_ROOT / path.lstrip("/")
            if controllers == "" and (base / "cpu.max").exists():
                return _v2(base)
    except (OSError, ValueError):
        pass
    return None, None


def _v1(base: Path) -> tuple[Path | None, float | None]:
    stat = base / "cpu.stat"
    try:
        quota = int((base / "cpu.cfs_quota_us").read_text())
        period = int((base / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return (stat if stat.exists() else None), None
    return (stat if stat.exists() else None), (quota / period if quota > 0 else None)


def _v2(base: Path) -> tuple[Path | None, float | None]:
    stat = base / "cpu.stat"
    try:
        quota, period = (base / "cpu.max").read_text().split()
        share = int(quota) / int(period) if quota != "max" else None
    except (OSError, ValueError):
        share = None
    return (stat if stat.exists() else None), share


def throttled_s(stat: Path | None) -> float | None:
    """Seconds the cgroup has been throttled (v1 ``throttled_time``, v2
    ``throttled_usec``); None where unreadable."""
    if stat is None:
        return None
    try:
        fields = dict(line.split()[:2] for line in stat.read_text().splitlines() if line)
        if "throttled_usec" in fields:
            return int(fields["throttled_usec"]) * 1e-6
        return int(fields["throttled_time"]) * 1e-9
    except (OSError, ValueError, KeyError):
        return None


def address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` of ``--send-to``; ValueError where it is not one."""
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"--send-to {text!r}: give HOST:PORT")
    return host, int(port)


def spin(seconds: float, send=None, every_s: float = 0.0
         ) -> tuple[float, list[float], list[float], int]:
    """Spin on a clock for ``seconds``, calling ``send()`` every ``every_s`` where given:
    (the wall it ran, running spans, frozen spans, sends). A freeze inside a send counts
    as one between two readings does."""
    clock = time.perf_counter
    start = last = begin = clock()
    due = start + every_s
    runs: list[float] = []
    frozen: list[float] = []
    sends = 0
    while last - start < seconds:
        now = clock()
        if send is not None and now >= due:
            send()
            sends += 1
            due = now + every_s
            now = clock()
        if now - last > FROZEN_GAP_S:
            runs.append(last - begin)
            frozen.append(now - last)
            begin = now
        last = now
    return last - start, runs, frozen, sends


def one(wake_ms: float, seconds: float, stat: Path | None, waker: str = "sleep",
        target: tuple[str, int] = ("127.0.0.1", 9)) -> dict[str, float]:
    """One spin with a waker of ``wake_ms`` (0: none) beside it, or in it (``send``)."""
    child, send, sock = None, None, None
    if wake_ms > 0 and waker == "sleep":
        child = subprocess.Popen([sys.executable, "-I", "-c", _WAKER, str(wake_ms / 1e3),
                                  str(seconds + 2 * SETTLE_S)], stdout=subprocess.PIPE,
                                 text=True)
        time.sleep(SETTLE_S)
    elif wake_ms > 0:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        payload = bytes(DATAGRAM_BYTES)

        def send() -> None:
            try:
                sock.sendto(payload, target)
            except OSError:  # an ICMP error of the last datagram, reported on this one
                pass
    try:
        before = throttled_s(stat)
        wall, runs, frozen, sends = spin(seconds, send, wake_ms / 1e3)
        after = throttled_s(stat)
    finally:
        if sock is not None:
            sock.close()
    wakes = math.nan
    if child is not None:
        out, _ = child.communicate(timeout=seconds + 30)
        wakes = float(out.strip() or "nan") / (seconds + 2 * SETTLE_S)
    elif send is not None:
        wakes = sends / wall
    # the first and last running spans are cut by the spin's ends
    inner = runs[1:]
    return {"share": 1.0 - sum(frozen) / wall,
            "on_ms": 1e3 * statistics.median(inner) if inner else math.nan,
            "off_ms": 1e3 * statistics.median(frozen) if frozen else math.nan,
            "throttled": ((after - before) / wall if before is not None and after is not None
                          else math.nan),
            "wakes": wakes}


def _cell(values: list[float], digits: int) -> str:
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "-"
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    try:
        waits = intervals(args.wake_ms)
        if not (math.isfinite(args.seconds) and 0 < args.seconds <= 60):
            raise ValueError(f"--seconds {args.seconds:g}: give 0 < seconds <= 60")
        if not 1 <= args.repeats <= 1000:
            raise ValueError(f"--repeats {args.repeats}: give 1 to 1000")
        target = address(args.send_to)
    except ValueError as exc:
        print(f"quota_wakes: {exc}", file=sys.stderr)
        return 2
    stat, nominal = cgroup_files()
    results: dict[float, list[dict[str, float]]] = {w: [] for w in waits}
    order = random.Random(args.seed)
    for _ in range(args.repeats):
        todo = list(dict.fromkeys(waits))
        order.shuffle(todo)
        for wake in todo:
            results[wake].append(one(wake, args.seconds, stat, args.waker, target))
    quota = (f"a quota of {nominal:.2f} of a CPU" if nominal else
             "no CPU quota" if stat is not None else "not readable here")
    kind = ("a child that sleeps each interval" if args.waker == "sleep" else
            f"a {DATAGRAM_BYTES} B datagram to {args.send_to} each interval")
    print(f"# a spin of {args.seconds:g} s with {kind}, {args.repeats} repeats, random "
          f"order; this process's cgroup: {quota}; median (min-max)", flush=True)
    print(f"{'wake ms':>8}  {'running share':>20}  {'on ms':>20}  {'frozen ms':>20}  "
          f"{'throttled share':>20}  {'wakes/s' if args.waker == 'sleep' else 'sends/s':>16}")
    for wake in dict.fromkeys(waits):
        rows = results[wake]
        label = f"{wake:g}" if wake else "none"
        print(f"{label:>8}  {_cell([r['share'] for r in rows], 3):>20}  "
              f"{_cell([r['on_ms'] for r in rows], 2):>20}  "
              f"{_cell([r['off_ms'] for r in rows], 2):>20}  "
              f"{_cell([r['throttled'] for r in rows], 3):>20}  "
              f"{_cell([r['wakes'] for r in rows], 0):>16}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
