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
and the freeze that pays it, are shorter. This measures how much that changes. For each
interval of ``--wake-ms`` (0: none), this process spins on a clock for ``--seconds``
beside one of two ``--waker`` kinds:

- ``sleep``: a child process in the same cgroups sleeps the interval in a loop, so it
  wakes on the CPU each time;
- ``send``: the spin itself sends a 1 KB UDP datagram to ``--send-to`` each interval (a
  system call through the network stack on this CPU, as an MPI rank's sends are; no
  task wakes);
- ``cpuclock``: the spin itself reads its thread's CPU clock each interval
  (``time.thread_time()``, ``clock_gettime(CLOCK_THREAD_CPUTIME_ID)``, which a training
  rank's phase timer reads around its compute, comm and wait phases). No task wakes, but
  to answer it the kernel brings the running task's runtime up to date
  (``task_sched_runtime`` calls ``update_curr`` in ``kernel/sched/core.c``), which is
  where the quota is checked.

Each gap of more than 0.3 ms between two clock readings is a freeze (as in the cluster's
probe), a send's own time included. It prints, per interval, the median and range over
``--repeats`` of:

- the running share: the spin's wall not frozen, over its wall (a waker's own runs,
  each well under 0.3 ms, fall inside it);
- the spin's own CPU share: its CPU time over its wall (the waker's runs left out);
- the median running and frozen span;
- the share of wall the kernel counted the cgroup throttled (``cpu.stat``; not readable
  inside a node, whose sysfs is its own);
- the wakes (or sends) per second during the spin.

The intervals run in a random order within each repeat. Run it inside a node::

    syncbench cluster up --nodes 2 --node-speed 1,0.5
    syncbench cluster exec sbnode2 -- python -m syncbench.bench.micro.quota_wakes
    syncbench cluster exec sbnode2 -- python -m syncbench.bench.micro.quota_wakes \\
        --waker send --send-to 10.77.0.1:9

Figures: docs/RESULTS.md, "A quota's share and the wake-ups on its CPU".
"""

from __future__ import annotations

import math
import random
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from syncbench.bench.cluster.cpu import CGROUP_ROOT, FROZEN_GAP_S
from syncbench.bench.micro.pair import flag_parser, known_flags

WAKERS = ("sleep", "send", "cpuclock")
#: The shortest and longest interval of ``--wake-ms`` (a shorter sleep is a busy loop; a
#: longer one would outlast the spin).
WAKE_MS_MIN, WAKE_MS_MAX = 0.05, 1000.0
#: Bytes of each datagram of ``--waker send``.
DATAGRAM_BYTES = 1024
#: Seconds the waker runs before the spin starts, and past its end.
SETTLE_S = 0.1
#: The waker: sleep the interval in a loop until the deadline, then read the spin's
#: window (two ``time.monotonic`` readings) and print how many of its wakes fell in it.
_WAKER = """
import sys, time
interval, deadline = float(sys.argv[1]), time.monotonic() + float(sys.argv[2])
wakes = []
while time.monotonic() < deadline:
    time.sleep(max(0.0, min(interval, deadline - time.monotonic())))
    wakes.append(time.monotonic())
start, end = (float(v) for v in sys.stdin.readline().split())
print(sum(start <= t <= end for t in wakes))
"""


def parse(argv: list[str] | None) -> tuple[list[float], float, int, str, tuple[str, int], int]:
    """(intervals in ms, seconds, repeats, waker, send address, seed); ValueError (one
    line naming the flag) for anything else."""
    parser = flag_parser("quota_wakes", __doc__)
    parser.add_argument("--wake-ms", default="0,0.5,1,2,4,8",
                        help="the waker's interval in ms, comma-separated (0: no waker; "
                        f"else {WAKE_MS_MIN:g} to {WAKE_MS_MAX:g})")
    parser.add_argument("--seconds", default="1", help="seconds each spin runs (default 1)")
    parser.add_argument("--repeats", default="5", help="spins per interval (default 5)")
    parser.add_argument("--waker", default="sleep",
                        help="sleep: a child process wakes each interval; send: the spin "
                        "sends a UDP datagram each interval; cpuclock: the spin reads its "
                        "thread's CPU clock each interval (default sleep)")
    parser.add_argument("--send-to", default="127.0.0.1:9", metavar="HOST:PORT",
                        help="where --waker send sends (default 127.0.0.1:9, discard)")
    parser.add_argument("--seed", default="0", help="seed of the order (default 0)")
    args = known_flags(parser, "quota_wakes", argv)
    waits = intervals(args.wake_ms)
    seconds = _number("--seconds", args.seconds, float)
    if not (math.isfinite(seconds) and 0 < seconds <= 60):
        raise ValueError(f"quota_wakes: --seconds {args.seconds}: give 0 < seconds <= 60")
    repeats = _number("--repeats", args.repeats, int)
    if not 1 <= repeats <= 1000:
        raise ValueError(f"quota_wakes: --repeats {args.repeats}: give 1 to 1000")
    if args.waker not in WAKERS:
        raise ValueError(f"quota_wakes: --waker {args.waker!r}: give one of "
                         f"{', '.join(WAKERS)}")
    target = address(args.send_to) if args.waker == "send" else ("127.0.0.1", 9)
    return waits, seconds, repeats, args.waker, target, _number("--seed", args.seed, int)


def _number(flag: str, text: str, kind: type) -> float | int:
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"quota_wakes: {flag} {text!r} is not a number") from None


def intervals(text: str) -> list[float]:
    """Milliseconds of ``--wake-ms``: each 0 or in [WAKE_MS_MIN, WAKE_MS_MAX]."""
    try:
        values = [float(v) for v in text.split(",")]
    except ValueError:
        raise ValueError(f"quota_wakes: --wake-ms {text!r}: give milliseconds, "
                         "comma-separated") from None
    if not all(v == 0 or WAKE_MS_MIN <= v <= WAKE_MS_MAX for v in values):
        raise ValueError(f"quota_wakes: --wake-ms {text!r}: each interval must be 0 (no "
                         f"waker) or {WAKE_MS_MIN:g} to {WAKE_MS_MAX:g} ms")
    return values


def address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` of ``--send-to`` as an IPv4 address and port, looked up once."""
    host, _, port = text.rpartition(":")
    if not host or not (port.isascii() and port.isdecimal()) or not 0 < int(port) < 65536:
        raise ValueError(f"quota_wakes: --send-to {text!r}: give HOST:PORT")
    try:
        found = socket.getaddrinfo(host, int(port), socket.AF_INET, socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        raise ValueError(f"quota_wakes: --send-to {text!r}: no IPv4 address for "
                         f"{host}") from None
    return found[0][4][0], int(port)


def cgroup_files() -> tuple[Path | None, float | None]:
    """(this process's ``cpu.stat`` that counts throttled time, the nominal share its
    own cgroup's quota gives: quota over period; None for either where there is none or
    it cannot be read). Inside a node the cgroup file systems are not mounted:
    ``ip netns exec`` mounts a sysfs of the node's own."""
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
            if controllers == "" and (base / "cpu.stat").exists():
                return _v2(base)
    except (OSError, ValueError):
        pass
    return None, None


def _v1(base: Path) -> tuple[Path, float | None]:
    try:
        quota = int((base / "cpu.cfs_quota_us").read_text())
        period = int((base / "cpu.cfs_period_us").read_text())
    except (OSError, ValueError):
        return base / "cpu.stat", None
    return base / "cpu.stat", (quota / period if quota > 0 else None)


def _v2(base: Path) -> tuple[Path, float | None]:
    try:  # the root cgroup has no cpu.max: no quota
        quota, period = (base / "cpu.max").read_text().split()
        share = int(quota) / int(period) if quota != "max" else None
    except (OSError, ValueError):
        share = None
    return base / "cpu.stat", share


def throttled_s(stat: Path | None) -> float | None:
    """Seconds the cgroup has been throttled (v1 ``throttled_time``, v2
    ``throttled_usec``); None where unreadable."""
    if stat is None:
        return None
    from syncbench.bench.cluster.cpu import throttled_seconds  # lazy: only where read

    try:
        return throttled_seconds(stat.read_text())
    except OSError:
        return None


def spin(seconds: float, send=None, every_s: float = 0.0
         ) -> tuple[float, list[float], list[float], int]:
    """Spin on a clock for ``seconds``, calling ``send()`` every ``every_s`` where given
    (it returns whether it sent): (the wall it ran, running spans, frozen spans, sends).
    A freeze inside a send counts as one between two readings does. The running span
    the spin's end cuts is not in the list."""
    clock = time.perf_counter
    start = last = begin = clock()
    due = start + every_s
    runs: list[float] = []
    frozen: list[float] = []
    sends = 0
    while last - start < seconds:
        now = clock()
        if send is not None and now >= due:
            sends += bool(send())
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
    wakes = math.nan
    try:
        if wake_ms > 0 and waker == "sleep":
            child = subprocess.Popen([sys.executable, "-I", "-c", _WAKER, str(wake_ms / 1e3),
                                      str(seconds + 2 * SETTLE_S)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
            time.sleep(SETTLE_S)
        elif wake_ms > 0 and waker == "cpuclock":
            def send() -> bool:
                time.thread_time()
                return True
        elif wake_ms > 0:
            sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            payload = bytes(DATAGRAM_BYTES)

            def send() -> bool:
                try:
                    sock.sendto(payload, target)
                    return True
                except OSError:  # not sent (a full queue, an unreachable network)
                    return False
        before, cpu, opened = throttled_s(stat), time.process_time(), time.monotonic()
        wall, runs, frozen, sends = spin(seconds, send, wake_ms / 1e3)
        after, cpu, closed = throttled_s(stat), time.process_time() - cpu, time.monotonic()
        if child is not None:
            out, _ = child.communicate(f"{opened} {closed}\n", timeout=seconds + 30)
            wakes = float(out.strip() or "nan") / wall
        elif send is not None:
            wakes = sends / wall
    finally:
        if sock is not None:
            sock.close()
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
    # the first running span is cut by the spin's start (the last is not in ``runs``)
    inner = runs[1:]
    return {"share": 1.0 - sum(frozen) / wall,
            "cpu": cpu / wall,
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
    try:
        waits, seconds, repeats, waker, target, seed = parse(argv)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    stat, nominal = cgroup_files()
    results: dict[float, list[dict[str, float]]] = {w: [] for w in waits}
    order = random.Random(seed)
    for _ in range(repeats):
        todo = list(dict.fromkeys(waits))
        order.shuffle(todo)
        for wake in todo:
            results[wake].append(one(wake, seconds, stat, waker, target))
    quota = (f"a quota of {nominal:.2f} of a CPU" if nominal else
             "no CPU quota" if stat is not None else "not readable here")
    kind = ("a child that sleeps each interval" if waker == "sleep" else
            "a read of its thread's CPU clock each interval" if waker == "cpuclock" else
            f"a {DATAGRAM_BYTES} B datagram to {target[0]}:{target[1]} each interval")
    print(f"# a spin of {seconds:g} s with {kind}, {repeats} repeats, random order; this "
          f"process's cgroup: {quota}; median (min-max)", flush=True)
    rate = {"sleep": "wakes/s", "cpuclock": "reads/s"}.get(waker, "sends/s")
    print(f"{'wake ms':>8}  {'running share':>20}  {'own CPU share':>20}  {'on ms':>20}  "
          f"{'frozen ms':>20}  {'throttled share':>20}  {rate:>16}")
    for wake in dict.fromkeys(waits):
        rows = results[wake]
        label = f"{wake:g}" if wake else "none"
        print(f"{label:>8}  {_cell([r['share'] for r in rows], 3):>20}  "
              f"{_cell([r['cpu'] for r in rows], 3):>20}  "
              f"{_cell([r['on_ms'] for r in rows], 2):>20}  "
              f"{_cell([r['off_ms'] for r in rows], 2):>20}  "
              f"{_cell([r['throttled'] for r in rows], 3):>20}  "
              f"{_cell([r['wakes'] for r in rows], 0):>16}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
