"""Low-precision gossip: neighbours' models kept as replicas, compressed changes sent.

DCD-PSGD (Tang et al., NeurIPS 2018, "Communication compression for decentralized
training", arXiv 1803.06443, Alg. 1), the scheme of Bagua's low-precision decentralized
SGD (``bagua/torch_api/algorithms/decentralized.py``, ``LowPrecisionDecentralized``):
every rank keeps a replica of each neighbour's model, equal to it at every step, because
a rank's model moves only by the compressed change it sends. At step t rank i

1. receives its sources' codes C(z_j) of step t-1 and adds them to its replicas;
2. mixes ``sum_j W_ij x_j`` from its own model and the replicas, and the local optimizer
   steps that with the gradient of its own model (as :mod:`.gossip`);
3. sends ``C(z_i)``, z_i = (that result) - x_i, and sets ``x_i <- x_i + C(z_i)``.

The codes of step t-1 travel by one ``Ineighbor_allgather`` posted before step t's compute
and completed after it; one graph communicator joins every rank to the union of its
sources and destinations over the graph's cycle (a replica must follow every change). The
codecs are those of :mod:`syncbench.algorithms.codecs` that keep every element: ``fp16``,
``bf16``, ``int8[:CHUNK]`` (float32 models only). Replicas start exact: one
``Neighbor_allgather`` of the models before training.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from syncbench.algorithms.averagers import ModelAverager
from syncbench.algorithms.averagers.gossip import consensus
from syncbench.algorithms.codecs import MinMaxCode, MinMaxUInt8Codec, parse_codec
from syncbench.algorithms.graphs import GraphSchedule

#: ``--gossip-codec`` codecs (a sparsifier or a low-rank code would not keep replicas
#: close enough without error feedback, which DCD-PSGD does not have).
GOSSIP_CODECS = ("fp16", "bf16", "int8")


def gossip_codec(spec: str) -> Any:
    """The codec of ``--gossip-codec spec`` (``none`` -> None); one-line ``ValueError``."""
    if spec == "none":
        return None
    codec = parse_codec(spec)
    if codec.name not in GOSSIP_CODECS:
        raise ValueError(f"--gossip-codec {spec}: choose none or one of "
                         f"{', '.join(GOSSIP_CODECS)}")
    return codec


def to_wire(codec: Any, z: np.ndarray) -> np.ndarray:
    """The bytes MPI sends for the float32 vector ``z``."""
    code = codec.encode(z)
    return code.pack() if isinstance(codec, MinMaxUInt8Codec) else code.view(np.uint8)


def from_wire(codec: Any, buffer: np.ndarray, count: int) -> np.ndarray:
    """The float32 values of :func:`to_wire`'s bytes."""
    if isinstance(codec, MinMaxUInt8Codec):
        return codec.decode(MinMaxCode.unpack(buffer, count, codec.chunk))
    return codec.decode(buffer.view(np.uint16))


def mix(own_weight: float, x: np.ndarray, weights: list[float],
        replicas: list[np.ndarray]) -> np.ndarray:
    """``W_ii x + sum_j W_ij x_j``, in this order (the serial re-computation uses it too)."""
    out = x * x.dtype.type(own_weight)
    for w, replica in zip(weights, replicas, strict=True):
        out += replica * x.dtype.type(w)
    return out


class CompressedGossipAverager(ModelAverager):
    """DCD-PSGD's exchange: replicas of the neighbours, compressed changes on the wire."""

    def __init__(self, core: Any, schedule: GraphSchedule, codec: Any) -> None:
        super().__init__(core)
        model, comm = core.model, core.comm
        if model.params.dtype != np.float32:
            raise ValueError(f"--gossip-codec {codec.spec} compresses float32 models, not "
                             f"{model.params.dtype} (use --dtype float32)")
        if model.buffers.size:
            raise ValueError(f"--gossip-codec {codec.spec}: models with running statistics "
                             "(BatchNorm) are not supported")
        self.schedule, self.codec, rank = schedule, codec, comm.rank
        sources = sorted({j for m in schedule.cycle for j in m.sources(rank)})
        destinations = sorted({k for m in schedule.cycle for k in m.destinations(rank)})
        self.row = {j: r for r, j in enumerate(sources)}
        self.out_degree = len(destinations)
        self.graph = comm.Create_dist_graph_adjacent(sources, destinations)
        n = self.n = int(model.params.size)
        #: Each source's model, as this rank knows it (exact: see the module's docstring).
        self.replicas = np.empty((len(sources), n), dtype=np.float32)
        self.graph.Neighbor_allgather(model.params, self.replicas)  # before training
        wire = self.wire_bytes = len(to_wire(codec, np.zeros(n, dtype=np.float32)))
        self.send = np.empty(wire, dtype=np.uint8)
        self.recv = np.empty((len(sources), wire), dtype=np.uint8)
        self.previous = np.empty(n, dtype=np.float32)  # x_i before this step's mixing
        self.request: Any = None

    def post(self) -> None:
        """Start sending last step's code to every destination (none before step 1)."""
        if self.core.steps_taken == 0:
            return
        self.request = self.core.comm.Ineighbor_allgather(self.graph, self.send, self.recv,
                                                          self.out_degree)

    def poll(self) -> None:
        self.core.comm.poll()

    def average(self) -> None:
        """Complete the exchange, bring the replicas up to date, and mix into the params."""
        core = self.core
        if self.request is not None:
            core.comm.Wait(self.request)
            self.request = None
            with core.timer.phase("codec"):
                for r in range(len(self.replicas)):
                    self.replicas[r] += from_wire(self.codec, self.recv[r], self.n)
        mixing = self.schedule.at(core.steps_taken)
        rank, params = core.comm.rank, core.model.params
        with core.timer.phase("update"):
            self.previous[...] = params
            params[...] = mix(mixing.self_weights[rank], self.previous, mixing.weights(rank),
                              [self.replicas[self.row[j]] for j in mixing.sources(rank)])

    def after_update(self) -> None:
        """Encode this step's change z = x - x_prev for the next post; x <- x_prev + C(z)
        (charged to ``codec``, as the decoding of the sources' codes)."""
        params = self.core.model.params
        with self.core.timer.phase("codec"):
            self.send[...] = to_wire(self.codec, params - self.previous)
            params[...] = self.previous + from_wire(self.codec, self.send, self.n)

    def consensus(self) -> tuple[Any, float]:
        """x_bar and the consensus distance (:func:`~.gossip.consensus`)."""
        return consensus(self.core)

    def state(self) -> dict[str, Any]:
        """The replicas and the code not yet sent (taken between steps)."""
        return {"replicas": self.replicas.copy(), "send": self.send.copy()}

    def load_state(self, state: dict[str, Any]) -> None:
        """The inverse of :meth:`state`."""
        self.replicas[...] = state["replicas"]
        self.send[...] = state["send"]

    def close(self) -> None:
        self.graph.Free()
