"""Model averagers: when and how the replicas of a strategy's ranks are averaged.

An averager is the part of a strategy that synchronizes parameters rather than
gradients, as PyTorch's ``torch/distributed/algorithms/model_averaging/averagers.py``
separates a ``ModelAverager`` (one method, ``average_parameters``, its period checked in
``__init__``) from the local optimizer that ``PostLocalSGDOptimizer`` steps. Each
variant is one small module:

+---------------------------------+--------------------------------------------------+-------------+
| averager                        | when, and what travels                           | used by     |
+=================================+==================================================+=============+
| ``periodic.PeriodicAverager``   | every H local steps: a blocking ``Allreduce``    | Local SGD   |
|                                 | of the parameters (and BatchNorm's statistics)   |             |
+---------------------------------+--------------------------------------------------+-------------+
| ``adaptive.AdaptiveAverager``   | per-rank local steps from every rank's speed:    | Oscars      |
|                                 | one packed ``Iallreduce`` of weighted deltas,    |             |
|                                 | speeds and step counts per round                 |             |
+---------------------------------+--------------------------------------------------+-------------+
| ``pseudo_gradient.              | every H local steps: a blocking ``Allreduce``    | SlowMo,     |
| PseudoGradientAverager``        | of the deltas from the anchor, then an outer     | DiLoCo      |
|                                 | optimizer step on the anchor                     |             |
+---------------------------------+--------------------------------------------------+-------------+
| ``streaming.StreamingAverager`` | P fragments of whole layers at staggered steps:  | Streaming   |
|                                 | each fragment's ``Iallreduce`` completed tau     | DiLoCo      |
|                                 | steps later, outer step, mixed by alpha          |             |
+---------------------------------+--------------------------------------------------+-------------+
| ``hierarchical.                 | every H1 steps a blocking ``Allreduce`` inside   | hierarchical|
| HierarchicalAverager``          | a node (or group), every H2 steps of every rank  |             |
+---------------------------------+--------------------------------------------------+-------------+
| ``gossip.GossipAverager``       | every step, with the graph's neighbours only:    | D-PSGD      |
|                                 | ``Ineighbor_allgather`` of the models on a       |             |
|                                 | distributed graph communicator, mixed by W       |             |
+---------------------------------+--------------------------------------------------+-------------+
| ``compressed_gossip.``          | the same, low precision: each step's change      | D-PSGD      |
| ``CompressedGossipAverager``    | through a codec, neighbours keep replicas        | (codec)     |
+---------------------------------+--------------------------------------------------+-------------+
| ``pairwise.PairwiseWindow``     | asynchronously, one random peer at a time: an    | (AD-PSGD)   |
|                                 | atomic average over RMA windows (EXCLUSIVE lock) |             |
+---------------------------------+--------------------------------------------------+-------------+

What becomes of the momentum buffers at an averaging (``--momentum-sync``) is
:func:`sync_momentum`. The schedule arithmetic lives apart, without MPI
(:mod:`~syncbench.algorithms.averagers.schedule`), for the simulator.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

#: ``--momentum-sync``: what becomes of the momentum buffers at an averaging.
MOMENTUM_SYNCS = ("keep", "zero", "average")


class ModelAverager(ABC):
    """Averages this rank's replica with every other rank's (collective)."""

    def __init__(self, core: Any) -> None:
        self.core = core

    @abstractmethod
    def average(self) -> None:
        """Average the replicas now (every rank calls it at the same point)."""


def average_over_ranks(core: Any, buf: Any) -> None:
    """``buf`` = its uniform mean over the ranks, in place: a blocking ``Allreduce``
    (charged by the communicator) then the 1/N scaling (charged to ``update``)."""
    core.comm.Allreduce(buf)
    with core.timer.phase("update"):
        buf *= 1.0 / core.comm.size


def sync_momentum(core: Any, mode: str) -> None:
    """Apply ``--momentum-sync`` to the local optimizer's moments at an averaging (momentum
    SGD's velocity; AdamW's two moments, since a first moment averaged over a second
    that is not divides other ranks' gradients by this rank's scale): ``keep`` them,
    ``zero`` them (``optimizer.reset_moments``), or replace each by its ``average``
    over the ranks (one blocking ``Allreduce`` per moment)."""
    if mode == "zero":
        core.optimizer.reset_moments()
    elif mode == "average":
        for moment in core.optimizer.moments:
            average_over_ranks(core, moment)


def round_wire_bytes(core: Any, momentum_sync: str, payload_bytes: int) -> int:
    """Bytes a rank hands to MPI at one averaging: the averaged vector (``payload_bytes``:
    the weights, a pseudo-gradient or its codes), BatchNorm's running statistics, and the
    optimizer's moments where ``--momentum-sync average`` averages them too. What a
    round-based strategy declares as ``wire_bytes_per_outer_step``, so that its bytes per
    sample are comparable with SSGD's."""
    moments = (sum(int(m.nbytes) for m in core.optimizer.moments)
               if momentum_sync == "average" else 0)
    return int(payload_bytes) + int(core.model.buffers.nbytes) + moments

