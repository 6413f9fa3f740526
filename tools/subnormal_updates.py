"""The momentum update's time as a model trains on, with and without the subnormal flush.

Usage:
    OMP_NUM_THREADS=1 python tools/subnormal_updates.py [--model mlp] [--steps 2000]
        [--every 100] [--flush-every 64]

Trains MODEL (batch 64, float32) on one fixed random batch with ``MomentumSGD``
(lr 0.01, momentum 0.9, no weight decay: ``syncbench speed``'s step) and prints,
every ``--every`` steps, the median time of ``MomentumSGD.step`` over those steps,
how many velocity elements are subnormal (nonzero, below ``finfo.tiny``) and how
many gradient elements are exactly 0, then the time of one flush.
``--flush-every 0`` turns the flush off
(the update as it was before ``algorithms/optimizer.py``'s ``SubnormalFlush``).
On a core that takes a microcode assist per subnormal operand the update's time
jumps once dead units' velocities have decayed there (docs/RESULTS.md).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.kernels.ops import flush_subnormals_
from syncbench.kernels.zoo import build_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--flush-every", type=int, default=64,
                        help="steps between flushes (0: never)")
    args = parser.parse_args()
    model = build_model(args.model, (1, 28, 28), 10, dtype=np.float32)
    opt = MomentumSGD(model.params, 0.01, 0.9, 0.0)
    opt.subnormal_flush.every = args.flush_every if args.flush_every > 0 else 1 << 62
    rng = np.random.default_rng(0)
    x = rng.random((64, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 64)
    tiny = np.finfo(np.float32).tiny
    print(f"# {args.model}: momentum update on one fixed batch, flush every "
          f"{args.flush_every or 'never'}; ms per update (median of {args.every})")
    times = []
    for step in range(1, args.steps + 1):
        model.loss_and_grad(x, y)
        start = time.perf_counter()
        opt.step(model.params, model.grads)
        times.append(time.perf_counter() - start)
        if step % args.every == 0:
            v, g = opt.velocity, model.grads
            subnormal = np.count_nonzero((v != 0) & (np.abs(v) < tiny))
            zeros = np.count_nonzero(g == 0)
            print(f"  step {step:6d}  update {np.median(times) * 1e3:7.3f} ms  "
                  f"subnormal velocities {subnormal:7d}  zero gradients {zeros:7d}")
            times = []
    spent = []
    for _ in range(300):
        start = time.perf_counter()
        flush_subnormals_(opt.velocity, opt.scratch)
        spent.append(time.perf_counter() - start)
    print(f"  one flush of the {opt.velocity.size} velocities: {np.median(spent) * 1e3:.3f} ms "
          "(median of 300)")


if __name__ == "__main__":
    main()
