"""The local optimizer's share of the simulated ``update``: AdamW where the workload stepped SGD.

A simulation replays the workload run's measured ``update`` rows, which hold that run's
local optimizer step (``jobs/validate_simulator.sh``'s workload is Local SGD: momentum
SGD). A strategy that steps with another optimizer (``--optimizer``, DiLoCo's default
AdamW, :mod:`~syncbench.algorithms.local_optimizer`) does more a step: AdamW reads the
parameters, the gradient and both moments and writes three of them, against momentum
SGD's velocity and parameters (``kernels/cpu/adamw.c``, ``kernels/cpu/optim.c``). The
replayed update is scaled by the ratio of the two optimizers' steps, timed in turn in this
process over the workload's parameter count (the fastest of :data:`REPEATS` each after one
untimed step, as ``--codec-seconds auto`` times a codec), with the same classes and
kernels ``train`` steps with.

Evidence (mlp, 235,146 parameters, 2 emulated nodes at 200 Mbit/s, docs/RESULTS.md):
DiLoCo's and Streaming DiLoCo's ``update`` was 0.16-0.25 ms a step against the Local SGD
workload's 0.07-0.08 ms, and the prediction of Streaming DiLoCo, once its synced bytes
were right, came out 37% fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

import numpy as np

from syncbench.algorithms.adamw import AdamW
from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.bench.simulate.workload import Workload, run_optimizer

#: Timed steps of each optimizer (the fastest counts): a step takes 0.05-0.2 ms on mlp,
#: and the fastest of 5 moved DiLoCo's predicted samples/s by up to 3% from one
#: simulation of the same run file to the next (docs/RESULTS.md); of 50 in turn, under 0.1%.
REPEATS = 50


def fastest_in_turn(ops: Sequence[Callable[[], object]], repeats: int = REPEATS
                    ) -> list[float]:
    """Each of ``ops``' fastest seconds over ``repeats`` rounds that run them one after the
    other (so that all see the host at the same speed), each op run once untimed first
    (caches, the library)."""
    for op in ops:
        op()
    best = [float("inf")] * len(ops)
    for _ in range(repeats):
        for i, op in enumerate(ops):
            start = time.perf_counter()
            op()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def _optimizer(name: str, params: np.ndarray) -> AdamW | MomentumSGD:
    if name == "adamw":
        return AdamW(params, 1e-3, 0.01, (0.9, 0.999), 1e-8)
    return MomentumSGD(params, 0.05, 0.9, 1e-4)


@functools.lru_cache(maxsize=16)
def step_ratio(name: str, other: str, count: int) -> float:
    """Fastest seconds of one ``name`` (``sgd`` or ``adamw``) step over ``count`` float32
    parameters over the fastest of an ``other`` step, timed in this process one after the
    other (so that both see the host at the same speed)."""
    rng = np.random.default_rng(0)
    grads = rng.standard_normal(count, dtype=np.float32) * np.float32(1e-3)
    ops = []
    for kind in (name, other):
        params = rng.standard_normal(count, dtype=np.float32)
        optimizer = _optimizer(kind, params)
        ops.append(functools.partial(optimizer.step, params, grads))
    best = fastest_in_turn(ops)
    return best[0] / best[1]


def matched(cfg: argparse.Namespace, workload: Workload) -> Workload:
    """``workload`` with its update scaled to the simulated run's local optimizer (the
    factor in ``extra["update_factor"]``, recorded with the workload); itself where both
    step with the same one or the workload names none (a profile)."""
    measured = workload.extra.get("optimizer")
    simulated = run_optimizer(cfg.algorithm, getattr(cfg, "optimizer", None))
    if not measured or measured == simulated:
        return workload
    factor = step_ratio(simulated, measured, workload.params)
    extra = {**workload.extra, "update_factor": factor,
             "update_factor_source": f"{simulated} step / {measured} step, timed here"}
    return dataclasses.replace(workload.with_update(factor), extra=extra)
