"""The measurements behind ``syncbench speed`` (its command line and what it prints:
:mod:`syncbench.bench.commands.speed`): one process's training-step throughput of a
model, its FLOPs per step, the measured GEMM rate and a nominal peak from
``/proc/cpuinfo``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.bench.data.text import VOCAB
from syncbench.kernels.flops import UPDATE_FLOPS_PER_PARAM, LayerFlops, StepFlops, step_flops
from syncbench.kernels.gpt import flops_per_token, parse_gpt_spec
from syncbench.kernels.zoo import build_model

SHAPES = {"mlp": (1, 28, 28), "lenet": (1, 28, 28)}

#: Timed GEMMs (after one untimed); the fastest gives the rate.
GEMM_REPEATS = 5

CPUINFO = Path("/proc/cpuinfo")


def input_shape(model_name: str) -> tuple[int, ...]:
    """The input shape the model is timed on (28x28 greyscale unless SHAPES says otherwise)."""
    return SHAPES.get(model_name, (1, 28, 28))


def timed_model(model_name: str, batch: int, dtype: str = "float32", seed: int = 0
                ) -> tuple[object, np.ndarray, np.ndarray]:
    """(model, inputs, targets) of one timed step: random images of the model's input
    shape and 10 classes, or for ``gpt`` random byte-token windows (its vocabulary 256)
    and their targets."""
    rng = np.random.default_rng(seed)
    spec = parse_gpt_spec(model_name)
    if spec is not None:
        model = build_model(model_name, (spec.ctx,), VOCAB, dtype=np.dtype(dtype), seed=seed)
        x, y = model.scratch_batch(rng, batch)
        return model, x, y
    shape = input_shape(model_name)
    model = build_model(model_name, shape, 10, dtype=np.dtype(dtype), seed=seed)
    return model, rng.random((batch, *shape)).astype(dtype), rng.integers(0, 10, batch)


def step_throughput(model_name: str, batch: int, steps: int, repeats: int,
                    dtype: str = "float32", seed: int = 0) -> list[float]:
    """Samples/s of each repeat of ``steps`` training steps (a sample of ``gpt`` is one
    token window)."""
    model, x, y = timed_model(model_name, batch, dtype, seed)
    opt = MomentumSGD(model.params, 0.01, 0.9, 0.0)
    for _ in range(3):  # warm-up: allocator, caches
        model.loss_and_grad(x, y)
    rates = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(steps):
            model.loss_and_grad(x, y)
            opt.step(model.params, model.grads)
        rates.append(batch * steps / (time.perf_counter() - start))
    return rates


def model_step_flops(model_name: str, batch: int) -> StepFlops:
    """FLOPs of one step of :func:`step_throughput` (momentum update without weight decay).

    ``gpt``: :func:`~syncbench.kernels.gpt.flops_per_token` per part (the blocks' GEMMs,
    attention's two batched products, the tied head) times the tokens of the batch; every
    one is a product whose weight and input gradients each cost its forward again."""
    spec = parse_gpt_spec(model_name)
    if spec is None:
        shape = input_shape(model_name)
        return step_flops(build_model(model_name, shape, 10).layers, shape, batch,
                          weight_decay=False)
    tokens = batch * spec.ctx
    parts = flops_per_token(spec, VOCAB)
    layers = tuple(LayerFlops(i, name, parts[name] * tokens, parts[name] * tokens,
                              parts[name] * tokens)
                   for i, name in enumerate(("blocks", "attention", "head")))
    params = build_model(model_name, (spec.ctx,), VOCAB).size
    return StepFlops(batch, layers, int(params), UPDATE_FLOPS_PER_PARAM[False])


# -- the GEMM rate and the nominal peak ------------------------------------------------

def gemm_rate(n: int, dtype: str = "float32", repeats: int = GEMM_REPEATS,
              seed: int = 0) -> tuple[float, float]:
    """(FLOP/s, seconds) of the fastest of ``repeats`` ``numpy.matmul`` of two n x n
    matrices of ``dtype`` (2 n^3 FLOP each), after one untimed product."""
    rng = np.random.default_rng(seed)
    a, b = (rng.random((n, n)).astype(dtype) for _ in range(2))
    out = np.empty((n, n), dtype=dtype)
    np.matmul(a, b, out=out)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.matmul(a, b, out=out)
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best, best


def blas_name() -> str:
    """NumPy's BLAS as its build configuration names it ("" when it does not say)."""
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]
    except Exception:  # older NumPy: no mode="dicts"
        return ""
    return f"{blas.get('name', '')} {blas.get('version', '')}".strip()


@dataclass(frozen=True)
class PeakEstimate:
    """A nominal peak of one core from ``/proc/cpuinfo``: vector bits, FMA, clock.

    Two FLOP per lane per FMA, ``units`` FMA instructions per cycle. How many
    FMA units the core has is not in ``/proc/cpuinfo`` (AVX-512 parts have
    one or two; AVX2 cores since Haswell and Zen 2 two), so both figures are
    given; ``cpu MHz`` is the clock when the file was read, not the clock
    under vector load.
    """

    vector_bits: int
    flags: tuple[str, ...]
    mhz: float
    lanes: int

    def flop_per_cycle(self, units: int) -> int:
        return self.lanes * 2 * units

    def flops(self, units: int) -> float:
        return self.flop_per_cycle(units) * self.mhz * 1e6

    def as_dict(self) -> dict:
        return {"vector_bits": self.vector_bits, "flags": list(self.flags), "mhz": self.mhz,
                "lanes": self.lanes, "flop_per_cycle": {"1": self.flop_per_cycle(1),
                                                        "2": self.flop_per_cycle(2)},
                "flops": {"1": self.flops(1), "2": self.flops(2)}}


def peak_estimate(cpuinfo: str, dtype: str = "float32") -> PeakEstimate | str:
    """The estimate from the text of ``/proc/cpuinfo`` (its first processor), or why there
    is none (one phrase)."""
    flags: set[str] = set()
    mhz = 0.0
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "flags" and not flags:
            flags = set(value.split())
        elif key == "cpu MHz" and not mhz:
            try:
                mhz = float(value)
            except ValueError:
                pass
    if not flags:
        return "no flags line in /proc/cpuinfo"
    if "fma" not in flags:
        return "no fma flag in /proc/cpuinfo"
    if mhz <= 0:
        return "no cpu MHz in /proc/cpuinfo"
    bits, named = (512, ("avx512f", "fma")) if "avx512f" in flags else (256, ("avx2", "fma"))
    if bits == 256 and "avx2" not in flags:
        named = ("avx", "fma")
    lanes = bits // (8 * np.dtype(dtype).itemsize)
    return PeakEstimate(bits, named, mhz, lanes)


def read_peak_estimate(dtype: str) -> PeakEstimate | str:
    """:func:`peak_estimate` of this machine's ``/proc/cpuinfo``."""
    try:
        text = CPUINFO.read_text()
    except OSError:
        return "no /proc/cpuinfo"
    return peak_estimate(text, dtype)


def peak_line(peak: PeakEstimate | str, dtype: str) -> str:
    """The header line of the estimate."""
    if isinstance(peak, str):
        return f"# nominal peak: not estimated ({peak})"
    return (f"# nominal peak of one core, an estimate (not measured): {peak.vector_bits}-bit FMA "
            f"({', '.join(peak.flags)}), {peak.lanes} {dtype} lanes x 2 FLOP x FMA units x "
            f"{peak.mhz:.0f} MHz (cpu MHz now) = {peak.flops(2) / 1e9:.1f} GFLOP/s with 2 FMA "
            f"units ({peak.flop_per_cycle(2)} FLOP/cycle), {peak.flops(1) / 1e9:.1f} with 1 "
            f"({peak.flop_per_cycle(1)}); the unit count is not in /proc/cpuinfo")



HEADER = (f"# {'model':<8}{'params':>10}{'median [samples/s]':>20}{'min':>12}{'max':>12}"
          f"{'ms/step':>10}{'MFLOP/step':>12}{'GFLOP/s':>10}{'of GEMM':>9}")
