"""PyTorch's ``powerSGD_hook`` run step by step in a process of its own (a gloo world of
one rank), for ``test_compress_peer.py``'s comparison with our PowerSGD state.

    python tests/e2e/powersgd_hook_steps.py IN.npz OUT.npz

IN holds ``grads`` (one flat float32 gradient a step), ``shapes`` (the parameters'
shapes, flattened, with ``ndims``), ``rank``, ``start`` and ``seed``; OUT gets, per step,
the hook's result and, once it compresses, its P, Q and error memories.

Why a process of its own: a gloo process group's C++ threads can outlive
``destroy_process_group`` and abort the process that made it later, at the destruction
of the group's last reference (``syncbench.bench.experiment.peers.torch_runner.exit_now``
says the same of the peer runner); a test process must not hold one. This process
writes its output, then leaves by ``os._exit`` without that teardown.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as hook


class Bucket:
    """The part of DDP's ``GradBucket`` the PowerSGD hook reads: one flat buffer, its
    per-parameter views, index 0, the last bucket of the step."""

    def __init__(self, flat: np.ndarray, shapes: list[tuple[int, ...]]) -> None:
        self.flat = torch.tensor(flat)  # torch's own memory: no numpy array kept alive
        self.shapes = shapes

    def buffer(self):
        return self.flat

    def index(self) -> int:
        return 0

    def is_last(self) -> bool:
        return True

    def gradients(self):
        views, at = [], 0
        for shape in self.shapes:
            n = int(np.prod(shape))
            views.append(self.flat[at:at + n].view(shape))
            at += n
        return views


def _shapes(flat: np.ndarray, ndims: np.ndarray) -> list[tuple[int, ...]]:
    shapes, at = [], 0
    for n in ndims:
        shapes.append(tuple(int(d) for d in flat[at:at + n]))
        at += n
    return shapes


def main(src: str, dst: str) -> int:
    given = np.load(src)
    shapes = _shapes(given["shapes"], given["ndims"])
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    state = hook.PowerSGDState(process_group=None,
                               matrix_approximation_rank=int(given["rank"]),
                               start_powerSGD_iter=int(given["start"]),
                               random_seed=int(given["seed"]))
    out: dict[str, np.ndarray] = {}
    for step, grad in enumerate(given["grads"]):
        out[f"result_{step}"] = hook.powerSGD_hook(state, Bucket(grad, shapes)).wait().numpy()
        if state.p_memory_dict:
            out[f"p_{step}"] = state.p_memory_dict[0].numpy().copy()
            out[f"q_{step}"] = state.q_memory_dict[0].numpy().copy()
            out[f"error_{step}"] = state.error_dict[0].numpy().copy()
    out["iter"] = np.array(state.iter)
    np.savez(dst + ".part.npz", **out)
    os.replace(dst + ".part.npz", dst)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    status = main(*sys.argv[1:3])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)
