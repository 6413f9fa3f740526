"""Encode and decode throughput of every gradient codec, in one process (no MPI).

For each codec and gradient size (1M and 10M float32 elements by default),
times ``repeats`` encodes and decodes after one untimed call of each and
prints GB/s of float32 gradient (``4 n`` bytes over the call's time) as median
(min-max), with the bytes the codec hands to MPI and the ratio to float32.
What a call is, per codec:

* ``fp16``, ``bf16``, ``int8``: ``encode(x)`` and ``decode(code)``;
* ``powersgd:2``: the gradient as one ``rows x cols`` matrix; encode is
  ``prepare`` (error feedback), ``p_buffer`` (orthogonalize Q, P = M Q) and
  ``q_buffer`` (orthogonalize P, Q = M^T P) with one rank's sums; decode is
  ``finish`` (P Q^T and the new error);
* ``topk:0.01``, ``randomk:0.01``: ``encode`` (selection or the seeded draw,
  and the gather) and ``decode`` into a dense vector; error feedback is not in
  the timed call.

Run it with ``OMP_NUM_THREADS=1`` for one core's figure::

    python -m syncbench.bench.micro.codecs [--repeats 5] [--sizes 1000000 10000000]

:func:`step_shares` (``syncbench speed --compress CODEC,...``) puts the same calls
beside a model's training step: per repeat, ``steps`` times a step's forward and backward
and at once an encode and decode of the gradient it has just written (PowerSGD on the
model's own tensors, as the reducer lays them out), as a reducer meets it after
backward, with the step's own data in the caches; then ``steps`` times a step and a
plain copy of the gradient into a buffer made once, timed the same way: one read and one write
of it, the floor under a codec's two passes. The share is the codec's (the copy's) time
over the compute's, repeat by repeat. Timed as a block of codec calls after a block of
steps instead, the calls after the first find the gradient warm: mlp's int8 took
2.4-3.0% of a batch-256 step so, against 3.7-5.6% a call after each step
(docs/RESULTS.md). It is one rank's encode and decode of its whole gradient; on N ranks
the reduce-scatter codecs (fp16, bf16, int8) also decode N - 1 received segments and
re-encode the mean's 1/N, which this does not time.
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from syncbench.algorithms.codecs import PowerSGD, parse_codec

SPECS = ("fp16", "bf16", "int8", "powersgd:2", "topk:0.01", "randomk:0.01")
SIZES = (1_000_000, 10_000_000)


@dataclass
class CodecRate:
    """Throughputs of one codec on one size: GB/s of float32 gradient per call."""

    spec: str
    count: int
    wire_bytes: int
    encode: list[float]
    decode: list[float]


def matrix_shape(count: int) -> tuple[int, int]:
    """The most nearly square ``rows x cols == count`` with ``rows <= cols``."""
    rows = math.isqrt(count)
    while count % rows:
        rows -= 1
    return rows, count // rows


def _calls(spec: str, x: np.ndarray, shapes: Sequence[tuple[int, ...]] | None = None
           ) -> tuple[Callable[[], object], Callable[[object], object], int]:
    """(encode, decode of encode's result, wire bytes) of ``spec`` on gradient ``x``;
    PowerSGD sees ``shapes`` (a model's tensors) or ``x`` as one matrix."""
    codec = parse_codec(spec)
    if isinstance(codec, PowerSGD):
        codec = PowerSGD(rank=codec.rank, start_iter=0)
        state = codec.state(list(shapes) if shapes is not None else [matrix_shape(x.size)])

        def encode() -> object:
            m = state.prepare(x)
            return m, state.q_buffer(m, state.p_buffer(m)), state.uncompressed_buffer(m)

        def decode(code: object) -> object:
            m, q, u = code  # type: ignore[misc]
            return state.finish(m, q, u, 1)

        return encode, decode, state.wire_bytes(x.size)
    if codec.name in ("randomk", "randk"):
        return (lambda: codec.encode(x, 0)), (lambda code: code.decode()), \
            codec.wire_bytes(x.size)
    if codec.name == "topk":
        return (lambda: codec.encode(x)), (lambda code: code.decode()), codec.wire_bytes(x.size)
    return (lambda: codec.encode(x)), codec.decode, codec.wire_bytes(x.size)


def codec_rates(specs: Sequence[str] = SPECS, sizes: Sequence[int] = SIZES,
                repeats: int = 5, seed: int = 0) -> list[CodecRate]:
    """Encode and decode GB/s of each codec on a random float32 gradient of each size."""
    rng = np.random.default_rng(seed)
    rows = []
    for count in sizes:
        x = rng.standard_normal(count, dtype=np.float32)
        gb = 4 * count / 1e9
        for spec in specs:
            encode, decode, wire = _calls(spec, x)
            decode(encode())  # untimed: allocator, caches, the first Q
            enc, dec = [], []
            for _ in range(repeats):
                start = time.perf_counter()
                code = encode()
                middle = time.perf_counter()
                decode(code)
                end = time.perf_counter()
                enc.append(gb / (middle - start))
                dec.append(gb / (end - middle))
            rows.append(CodecRate(spec, count, wire, enc, dec))
    return rows


def codec_seconds(spec: str, count: int, shapes: Sequence[tuple[int, ...]] | None = None,
                  repeats: int = 5, seed: int = 0) -> float:
    """Fewest seconds of one encode and decode of ``spec`` on a ``count``-element float32
    gradient laid out as ``shapes``, over ``repeats`` (what ``simulate --codec-seconds
    auto`` charges per step and rank: one rank's encode and decode of its whole gradient
    on this host; the fastest repeat, so that other work on the host while the
    simulator times it does not enter the prediction)."""
    x = np.random.default_rng(seed).standard_normal(count, dtype=np.float32)
    encode, decode, _ = _calls(spec, x, shapes)
    decode(encode())  # untimed: allocator, caches, the first Q
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        decode(encode())
        times.append(time.perf_counter() - start)
    return min(times)


@dataclass
class StepShare:
    """Seconds per step of a model's compute and of a codec's encode + decode, per repeat."""

    model: str
    spec: str
    wire_bytes: int
    gradient_bytes: int
    compute: list[float]
    codec: list[float]
    copy: list[float]

    @property
    def shares(self) -> list[float]:
        """The codec's time over the compute's, repeat by repeat."""
        return [c / s for c, s in zip(self.codec, self.compute)]

    @property
    def copy_shares(self) -> list[float]:
        """The gradient's plain copy's time over the compute's, repeat by repeat."""
        return [c / s for c, s in zip(self.copy, self.compute)]


def after_each_step(step: Callable[[], object], call: Callable[[], object],
                    steps: int) -> tuple[float, float]:
    """Mean seconds of ``step`` and of ``call`` made at once after it, ``steps`` times."""
    stepping = calling = 0.0
    for _ in range(steps):
        start = time.perf_counter()
        step()
        middle = time.perf_counter()
        call()
        calling += time.perf_counter() - middle
        stepping += middle - start
    return stepping / steps, calling / steps


def step_shares(models: Sequence[str], specs: Sequence[str], batch: int = 64,
                steps: int = 10, repeats: int = 5, seed: int = 0) -> list[StepShare]:
    """Each codec of ``specs`` beside each model's step (float32, one process), each call
    made at once after a step (:func:`after_each_step`), and a plain copy of the gradient
    so beside the same steps."""
    from syncbench.algorithms.codecs.powersgd import tensor_shapes
    from syncbench.bench.micro.speed import timed_model

    rows = []
    for name in models:
        model, x, y = timed_model(name, batch, "float32", seed)
        shapes = tensor_shapes([layer.param_shapes() for layer in model.layers],
                               model.layer_offsets)
        for _ in range(2):  # untimed: allocator, caches
            model.loss_and_grad(x, y)
        rows += [_step_share(name, model, x, y, spec, shapes, steps, repeats)
                 for spec in specs]
    return rows


def _step_share(name: str, model, x: np.ndarray, y: np.ndarray, spec: str,
                shapes: Sequence[tuple[int, ...]], steps: int, repeats: int) -> StepShare:
    """:func:`step_shares`'s row of one model and codec."""
    encode, decode, wire = _calls(spec, model.grads, shapes)
    decode(encode())  # untimed: the first Q, the selection's buffers

    def step() -> None:
        model.loss_and_grad(x, y)

    copy = np.empty_like(model.grads)  # made once: the copy times the bytes, not an mmap
    compute, codec, copied = [], [], []
    for _ in range(repeats):
        coding_steps, coding = after_each_step(step, lambda: decode(encode()), steps)
        copying_steps, copying = after_each_step(step, lambda: np.copyto(copy, model.grads),
                                                 steps)
        compute.append((coding_steps + copying_steps) / 2)
        codec.append(coding)
        copied.append(copying)
    return StepShare(name, spec, wire, model.grads.nbytes, compute, codec, copied)


def print_step_shares(rows: Sequence[StepShare], repeats: int) -> None:
    """One line per model and codec: ms per step of each side and the share."""
    print(f"# encode + decode of one rank's gradient at once after each step's forward and "
          f"backward; copy share: a plain copy of the gradient so (one read, one write); "
          f"median (min-max) of {repeats}")
    print(f"  {'model':<9}{'codec':<13}{'compute ms':<24}{'codec ms':<24}{'share':<22}"
          f"{'copy share':<22}{'wire B':>10}{'ratio':>7}")
    for r in rows:
        print(f"  {r.model:<9}{r.spec:<13}{_spread([1e3 * v for v in r.compute]):<24}"
              f"{_spread([1e3 * v for v in r.codec]):<24}{_share(r.shares):<22}"
              f"{_share(r.copy_shares):<22}"
              f"{r.wire_bytes:>10}{r.gradient_bytes / r.wire_bytes:>7.1f}", flush=True)


def _share(values: list[float]) -> str:
    return (f"{100 * statistics.median(values):5.1f}% "
            f"({100 * min(values):.1f}-{100 * max(values):.1f}%)")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):7.2f} ({min(values):.2f}-{max(values):.2f})"


def print_codec_rates(specs: Sequence[str] = SPECS, sizes: Sequence[int] = SIZES,
                      repeats: int = 5) -> list[CodecRate]:
    """Print the table of :func:`codec_rates` and return its rows."""
    rows = codec_rates(specs, sizes, repeats)
    print(f"codec encode/decode, GB/s of float32 gradient, median (min-max) of {repeats}")
    print(f"{'codec':<14}{'elements':>10}  {'encode GB/s':<22}{'decode GB/s':<22}"
          f"{'wire bytes':>12}{'ratio':>8}")
    for r in rows:
        print(f"{r.spec:<14}{r.count:>10}  {_spread(r.encode):<22}{_spread(r.decode):<22}"
              f"{r.wire_bytes:>12}{4 * r.count / r.wire_bytes:>8.1f}")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--codecs", nargs="+", default=list(SPECS))
    args = parser.parse_args(argv)
    if args.repeats < 1 or min(args.sizes) < 1:
        print("codecs: --repeats and --sizes must be >= 1", file=sys.stderr)
        return 2
    try:
        for spec in args.codecs:
            parse_codec(spec)
    except ValueError as err:
        print(f"codecs: {err}", file=sys.stderr)
        return 2
    print_codec_rates(args.codecs, args.sizes, args.repeats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
