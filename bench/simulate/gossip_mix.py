"""D-PSGD's mix and the post's copy, timed on this host in units of the workload's update.

``GossipAverager.average`` mixes ``x_i <- W_ii x_i + sum_j W_ij x_j``: ``send * own``,
then ``weights @ recv`` over the k sources' rows added in, then the result copied into the
parameters (``algorithms/averagers/gossip.py``); ``post`` copies the parameters into the
send buffer first. A simulation replays the workload run's measured ``update`` rows (its
local optimizer's step), so these are charged as multiples of that step: the mix's and
the copy's fastest seconds over the fastest of the workload's optimizer step, timed in
turn in this process over the workload's parameter count, as :mod:`.local_update` times
AdamW against momentum SGD (so that both see the host at the same speed).

Why timed and not counted in passes over memory: NumPy's product of a one-row matrix
takes another path than two or more rows. On an AMD EPYC KVM guest (235,146 float32, the
fastest of 50), the mix with k = 1 took 6.6 momentum SGD steps, with k = 2 2.1 and with
k = 4 2.3, where ``k + 1`` passes and a copy (the round figure before) gave 2.3, 3.3 and
5.3; D-PSGD's ``update`` on a ring of 2 emulated nodes measured 0.97-1.04 ms a step, the
round figure predicted 0.60 (docs/RESULTS.md, "Hook calls timed, D-PSGD at a quota and
the links' bucket").
"""

from __future__ import annotations

import functools

import numpy as np

from syncbench.bench.simulate.local_update import _optimizer, fastest_in_turn


def _mix_ops(count: int, sources: int, rng: np.random.Generator):
    """The averager's mix and the post's copy over ``count`` float32 parameters with
    ``sources`` rows (the operations of ``GossipAverager.average`` and ``post``)."""
    params = rng.standard_normal(count, dtype=np.float32)
    send = rng.standard_normal(count, dtype=np.float32)
    recv = rng.standard_normal((sources, count), dtype=np.float32)
    weights = np.full(sources, 1.0 / (sources + 1), dtype=np.float32)
    own = np.float32(1.0 / (sources + 1))

    def mix() -> None:
        mixed = send * own
        if sources:
            mixed += weights @ recv
        params[...] = mixed

    def copy() -> None:
        send[...] = params

    return mix, copy


@functools.lru_cache(maxsize=32)
def mix_ratios(sources: int, count: int, optimizer: str) -> tuple[float, float]:
    """(the mix, the post's copy) of ``count`` float32 parameters with ``sources`` rows,
    each in units of one ``optimizer`` step (``sgd`` or ``adamw``) over as many: the
    fastest of :data:`.local_update.REPEATS` of each, timed in turn
    (:func:`.local_update.fastest_in_turn`)."""
    if count <= 0:
        raise ValueError(f"a mix of {count} parameters")
    rng = np.random.default_rng(0)
    grads = rng.standard_normal(count, dtype=np.float32) * np.float32(1e-3)
    params = rng.standard_normal(count, dtype=np.float32)
    opt = _optimizer(optimizer, params)
    mix, copy = _mix_ops(count, sources, rng)
    best = fastest_in_turn((functools.partial(opt.step, params, grads), mix, copy))
    step = max(best[0], 1e-9)
    return best[1] / step, best[2] / step
