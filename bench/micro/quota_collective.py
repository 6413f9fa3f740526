"""Whether a collective among ranks at a CPU quota waits for a peer the quota froze.

At 4 emulated nodes on a 2-core host every node runs at speed 0.5 (a fixed half of a
core each), and the simulator's validation there predicted blocking SSGD's sync short
(lenet at 1 Gbit/s: 6.7-8.1 ms a step measured, 4.2 predicted). The simulator's quota
model (``syncbench.bench.simulate.quota``) charges a quota's freezes to the busy phases a
workload measured without communicating, and runs a collective at the link's pace. This
measures where the freezes fall once the ranks communicate.

Run on the host, as root, with a cluster up::

    syncbench cluster up --nodes 4 --link 1gbit --node-speed 0.5,0.5,0.5,0.5
    python -m syncbench.bench.micro.quota_collective --ranks 4 --model lenet

It launches ``--ranks`` ranks (``syncbench cluster mpiexec``, one per node). Each runs
``--steps`` blocking Allreduces of the model's gradient (``--bytes``) back to back, then
``--steps`` times a forward and backward of ``--model`` (or ``--spin-ms`` of CPU time)
followed by the same Allreduce, with no barrier between steps, as blocking SSGD does.
Each rank stamps every step's start, post and return on its node's
``CLOCK_MONOTONIC``. Meanwhile this process reads every node's throttled time every
``--sample-ms`` (the cgroup's ``cpu.stat``, which is not mounted inside a node). The
kernel adds a freeze's length there when the freeze ends, so an increase of ``d`` seen
between two reads is a freeze of ``d`` that ended between them. The two are joined on
the host's clock (a node's ``--clock-offset`` taken off). It prints, medians with
10th-90th percentiles, the first ``--skip`` steps left out:

- the Allreduce back to back, and after a step from the last rank's post to the last
  return (the collective's own time: no rank waits for another's compute in it);
- in how many of either a node was frozen inside that span, and, after a step, for how
  long at most;
- each rank's frozen time per step in its compute, in its wait for the last post, and
  after the last post.

``--out FILE.json`` writes the figures. Findings: docs/RESULTS.md, "A collective at 4
nodes waits for a frozen peer".
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np

from syncbench.bench.cluster.cpu import throttled_seconds
from syncbench.bench.files import write_atomic
from syncbench.bench.micro.output import check_writable_parent
from syncbench.bench.micro.pair import flag_parser, known_flags

#: A node frozen longer than this inside a collective counts as frozen in it (less is
#: within the reads' own spacing).
FROZEN_FLOOR_S = 0.3e-3


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = flag_parser("quota_collective", __doc__)
    parser.add_argument("--ranks", default="4", help="ranks, one per node (>= 2)")
    parser.add_argument("--model", default="lenet",
                        help="compute one forward and backward of this model before each "
                             "post (default lenet)")
    parser.add_argument("--batch-size", default="64", help="--model's batch (default 64)")
    parser.add_argument("--spin-ms", default=None,
                        help="spin this many ms of CPU time before each post in place of "
                             "the model's step")
    parser.add_argument("--bytes", default=None,
                        help="bytes each rank contributes to the Allreduce (default: the "
                             "model's gradient, float32)")
    parser.add_argument("--steps", default="150", help="steps per phase (default 150)")
    parser.add_argument("--skip", default="3", help="first steps left out (default 3)")
    parser.add_argument("--sample-ms", default="0.5",
                        help="milliseconds between two reads of the nodes' throttled time")
    parser.add_argument("--out", default=None, metavar="FILE.json", help="write the figures")
    parser.add_argument("--rank-side", default=None, help=argparse.SUPPRESS)
    args = known_flags(parser, "quota_collective", argv)
    args.ranks = _whole(args.ranks, "--ranks", 2, 64)
    args.batch_size = _whole(args.batch_size, "--batch-size", 1, 1 << 16)
    args.steps = _whole(args.steps, "--steps", 1, 1 << 20)
    args.skip = _whole(args.skip, "--skip", 0, args.steps - 1)
    args.sample_ms = _positive(args.sample_ms, "--sample-ms", 100.0)
    if args.spin_ms is not None:
        args.spin_ms = _positive(args.spin_ms, "--spin-ms", 10_000.0)
    if args.bytes is not None:
        args.bytes = _whole(args.bytes, "--bytes", 4, 1 << 30)
    if args.spin_ms is None:
        from syncbench.kernels.zoo import model_name  # lazy: the models import kernels

        try:
            model_name(args.model)
        except ValueError as exc:
            raise ValueError(f"quota_collective: --model: {exc}") from None
    elif args.bytes is None:
        raise ValueError("quota_collective: --spin-ms needs --bytes (no model to take the "
                         "gradient's size from)")
    if args.out is not None:
        try:
            check_writable_parent("--out", args.out)
        except ValueError as exc:
            raise ValueError(f"quota_collective: {exc}") from None
    return args


def _whole(text: str, flag: str, low: int, high: int) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"quota_collective: {flag} {text!r} is not a whole number") from None
    if not low <= value <= high:
        raise ValueError(f"quota_collective: {flag} {value} must be in {low}..{high}")
    return value


def _positive(text: str, flag: str, high: float) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"quota_collective: {flag} {text!r} is not a number") from None
    if not (math.isfinite(value) and 0 < value <= high):
        raise ValueError(f"quota_collective: {flag} {text} must be in (0, {high:g}]")
    return value


# -- on the nodes: the ranks -----------------------------------------------------------

def rank_main(args: argparse.Namespace) -> int:
    """One rank: the back-to-back phase, then the steps; rank 0 writes every rank's stamps
    (node clock) to ``--rank-side``."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    step, grad_bytes = _compute(args, rank)
    nbytes = args.bytes if args.bytes is not None else grad_bytes
    send = np.ones(max(1, nbytes // 4), np.float32)
    recv = np.empty_like(send)
    stamps: dict[str, list[tuple[float, float, float]]] = {"back_to_back": [], "steps": []}
    comm.Barrier()
    for _ in range(args.steps):
        t_post = time.monotonic()
        comm.Allreduce(send, recv)
        stamps["back_to_back"].append((t_post, t_post, time.monotonic()))
    comm.Barrier()
    for _ in range(args.steps):
        t_start = time.monotonic()
        step()
        t_post = time.monotonic()
        comm.Allreduce(send, recv)
        stamps["steps"].append((t_start, t_post, time.monotonic()))
    mine = {"node": socket.gethostname(), **stamps}
    every = comm.gather(mine, root=0)
    if rank == 0:
        write_atomic(args.rank_side,
                     json.dumps({"bytes": int(send.nbytes), "ranks": every}).encode())
    return 0


def _compute(args: argparse.Namespace, rank: int) -> tuple[Callable[[], None], int]:
    """What a rank does before each post, and its model's gradient bytes (0 for a spin)."""
    if args.spin_ms is not None:
        seconds = args.spin_ms / 1e3

        def spin() -> None:  # CPU time, not wall (pair.spin): the freezes do not shorten it
            begin = time.process_time()
            while time.process_time() - begin < seconds:
                pass
        return spin, 0
    from syncbench.bench.micro.speed import timed_model  # lazy: builds the model

    model, x, y = timed_model(args.model, args.batch_size, "float32", rank)
    model.loss_and_grad(x, y)  # untimed: allocator, caches
    return (lambda: model.loss_and_grad(x, y)), 4 * sum(int(np.size(p)) for p in model.params)


# -- on the host: the nodes' throttled time ------------------------------------------

class ThrottleReader:
    """Reads each node's throttled seconds (``cpu.stat``) every ``interval_s`` on a thread,
    keeping ``(the read before, this read, seconds)`` on the host's monotonic clock
    wherever the count moved."""

    def __init__(self, stats: Mapping[str, str], interval_s: float) -> None:
        self.interval_s = interval_s
        self.samples: dict[str, list[tuple[float, float, float]]] = {n: [] for n in stats}
        self._files = {name: os.open(path, os.O_RDONLY) for name, path in stats.items()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> ThrottleReader:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        for fd in self._files.values():
            os.close(fd)

    def _loop(self) -> None:
        last: dict[str, float] = {}
        previous = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            for name, fd in self._files.items():
                seconds = throttled_seconds(os.pread(fd, 512, 0).decode(errors="replace"))
                if seconds is not None and last.get(name) != seconds:
                    self.samples[name].append((previous, now, seconds))
                    last[name] = seconds
            previous = now
            time.sleep(self.interval_s)


def freezes(samples: Sequence[tuple[float, float, float]]) -> list[tuple[float, float]]:
    """A node's freezes as ``(begin, end)`` on the host's clock from its reads ``(the read
    before, this read, throttled seconds)``, kept where the count moved (the first is the
    count the reads started from). An increase ``d`` is a freeze that ended between the
    two reads: it is placed ending halfway between them and lasting ``d``."""
    out: list[tuple[float, float]] = []
    for (_, _, before), (previous, now, seconds) in zip(samples, samples[1:]):
        if seconds > before:
            end = 0.5 * (previous + now)
            out.append((end - (seconds - before), end))
    return out


def frozen_within(spans: Sequence[tuple[float, float]], begin: float, end: float) -> float:
    """Seconds of ``spans`` that fall within ``[begin, end]``."""
    return sum(max(0.0, min(end, b) - max(begin, a)) for a, b in spans)


def join(stamps: Mapping, offsets: Mapping[str, float],
         frozen: Mapping[str, Sequence[tuple[float, float]]], skip: int) -> dict:
    """The figures of a run: ``stamps`` as the ranks wrote them, each node's clock offset
    (its clock less the host's), each node's freezes on the host's clock."""
    ranks = stamps["ranks"]
    nodes = [r["node"] for r in ranks]

    def host(rank: dict, phase: str) -> np.ndarray:
        return np.asarray(rank[phase], float)[skip:] - offsets.get(rank["node"], 0.0)

    b2b = np.stack([host(r, "back_to_back") for r in ranks])  # ranks x steps x 3
    steps = np.stack([host(r, "steps") for r in ranks])
    spans = [frozen.get(node, []) for node in nodes]

    def each_step(begins: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """ranks x steps: each rank's node's frozen seconds within each step's span
        (``begins`` and ``ends`` per step, or per rank and step)."""
        begins, ends = np.broadcast_to(begins, steps.shape[:2]), np.broadcast_to(
            ends, steps.shape[:2])
        return np.array([[frozen_within(s, a, b) for a, b in zip(lo, hi)]
                         for s, lo, hi in zip(spans, begins, ends)])

    b2b_post, b2b_done = b2b[:, :, 1].max(0), b2b[:, :, 2].max(0)
    back_to_back = b2b_done - b2b_post
    b2b_most = each_step(b2b_post, b2b_done).max(0)
    last_post, last_done = steps[:, :, 1].max(0), steps[:, :, 2].max(0)
    after = last_done - last_post
    inside = each_step(last_post, last_done)
    in_compute = each_step(steps[:, :, 0], steps[:, :, 1])
    in_wait = each_step(steps[:, :, 1], last_post)
    most = inside.max(0)
    hit = most > FROZEN_FLOOR_S
    return {
        "nodes": nodes, "bytes": int(stamps["bytes"]), "steps": int(after.size),
        "step_ms": _spread(np.diff(steps[0, :, 0])),
        "compute_ms": _spread((steps[:, :, 1] - steps[:, :, 0]).ravel()),
        "back_to_back_ms": _spread(back_to_back),
        "after_step_ms": _spread(after),
        "after_step_less_most_frozen_ms": _spread(after - most),
        "steps_frozen_inside": float(hit.mean()),
        "back_to_back_frozen_inside": float((b2b_most > FROZEN_FLOOR_S).mean()),
        "most_frozen_inside_mean_ms": 1e3 * float(most.mean()),
        "frozen_per_rank_step_ms": {"compute": 1e3 * float(in_compute.mean()),
                                    "wait_for_last_post": 1e3 * float(in_wait.mean()),
                                    "after_last_post": 1e3 * float(inside.mean())},
        "frozen_share_per_node": {
            node: float(frozen_within(s, steps[k, 0, 0], steps[k, -1, 2])
                        / (steps[k, -1, 2] - steps[k, 0, 0]))
            for k, (node, s) in enumerate(zip(nodes, spans))},
    }


def _spread(values: np.ndarray) -> dict[str, float]:
    """Median and 10th and 90th percentiles, in ms."""
    v = 1e3 * np.asarray(values, float)
    return {"median": float(np.median(v)), "p10": float(np.percentile(v, 10)),
            "p90": float(np.percentile(v, 90))}


def report(figures: dict) -> str:
    """The figures as lines."""
    def ms(key: str) -> str:
        s = figures[key]
        return f"{s['median']:.2f} ms ({s['p10']:.2f}-{s['p90']:.2f})"

    per = figures["frozen_per_rank_step_ms"]
    shares = ", ".join(f"{n} {s:.2f}" for n, s in figures["frozen_share_per_node"].items())
    return "\n".join([
        f"# {len(figures['nodes'])} ranks ({', '.join(figures['nodes'])}), Allreduce of "
        f"{figures['bytes']} B, {figures['steps']} steps; median (10th-90th percentile)",
        f"step {ms('step_ms')}; compute {ms('compute_ms')} (wall, its freezes in it)",
        f"Allreduce back to back              {ms('back_to_back_ms')}; a node frozen in "
        f"it in {100 * figures['back_to_back_frozen_inside']:.0f}% of them",
        f"Allreduce after a step, last post on {ms('after_step_ms')}",
        f"  less the most-frozen node's time in it {ms('after_step_less_most_frozen_ms')}",
        f"a node frozen in it (> {1e3 * FROZEN_FLOOR_S:.1f} ms): "
        f"{100 * figures['steps_frozen_inside']:.0f}% of steps; the most-frozen node's time "
        f"in it: mean {figures['most_frozen_inside_mean_ms']:.2f} ms",
        f"a rank's frozen ms per step: in its compute {per['compute']:.2f}, waiting for the "
        f"last post {per['wait_for_last_post']:.2f}, after the last post "
        f"{per['after_last_post']:.2f}",
        f"share of the steps' wall each node was frozen: {shares}",
    ])


def host_main(args: argparse.Namespace) -> int:
    """Launch the ranks on the cluster's nodes while reading their throttled time."""
    from syncbench.bench.cluster.cpu import throttle_stat
    from syncbench.bench.cluster.host import ClusterError
    from syncbench.bench.cluster.state import load_up

    try:
        cluster = load_up()
    except ClusterError as exc:
        print(f"quota_collective: {exc}", file=sys.stderr)
        return 2
    if len(cluster.nodes) < args.ranks:
        print(f"quota_collective: --ranks {args.ranks}: the cluster has "
              f"{len(cluster.nodes)} nodes", file=sys.stderr)
        return 2
    nodes = cluster.nodes[:args.ranks]
    stats = {n.name: s for n in nodes if (s := throttle_stat(n))}
    offsets = {n.name: n.clock_offset_s for n in nodes}
    with tempfile.TemporaryDirectory(prefix="quota-collective-") as tmp:
        stamps_file = Path(tmp) / "stamps.json"
        os.chmod(tmp, 0o755)  # written by the ranks, which may run as another user
        launch = [sys.executable, "-m", "syncbench", "cluster", "mpiexec", "-n",
                  str(args.ranks), "--", sys.executable, "-m",
                  "syncbench.bench.micro.quota_collective", "--rank-side", str(stamps_file),
                  "--steps", str(args.steps), "--model", args.model,
                  "--batch-size", str(args.batch_size)]
        if args.spin_ms is not None:
            launch += ["--spin-ms", repr(args.spin_ms)]
        if args.bytes is not None:
            launch += ["--bytes", str(args.bytes)]
        with ThrottleReader(stats, args.sample_ms / 1e3) as reader:
            done = subprocess.run(launch, capture_output=True, text=True)
        if done.returncode != 0 or not stamps_file.exists():
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"quota_collective: the ranks failed (exit {done.returncode}): {last}",
                  file=sys.stderr)
            return 1
        stamps = json.loads(stamps_file.read_text())
    frozen = {name: freezes(samples) for name, samples in reader.samples.items()}
    figures = join(stamps, offsets, frozen, args.skip)
    figures.update(model=None if args.spin_ms is not None else args.model,
                   spin_ms=args.spin_ms, sample_ms=args.sample_ms,
                   node_speeds={n.name: n.speed for n in nodes},
                   node_throttles={n.name: n.throttle for n in nodes},
                   quota_read={n.name: n.name in stats for n in nodes})
    print(report(figures))
    if args.out:
        try:
            write_atomic(args.out, (json.dumps(figures, indent=1) + "\n").encode())
        except OSError as exc:  # WriteError: one line naming the file
            print(f"quota_collective: {exc}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    return rank_main(args) if args.rank_side else host_main(args)


if __name__ == "__main__":
    sys.exit(main())
