"""What a rank computes per step: from a measured run file, or a named profile.

A :class:`Workload` gives the parameter count (what is communicated), the batch
size, the per-step local seconds of the ``data``, ``compute`` and ``update``
phases (and a measured run's own ``delay``) of every simulated rank, and where
the model's hook calls fall in a step's compute (:class:`ComputeSplit`):

* ``--workload RUN.h5``: the rows of a measured run are replayed rank by rank,
  each measured rank's in their order (:meth:`Workload.draw`), so a slow rank
  stays slow; the model is rebuilt from the run's ``--model`` and dataset.
* ``--workload NAME``: a profile of ``profiles.toml``. ``mlp`` and ``lenet``
  carry the median seconds per step measured on one machine and the spread of
  the compute (lognormal); the others carry parameter counts and training FLOPs
  per sample from their papers, and need hardware (``--hardware-flops``, or
  ``--hardware h100|a100|v100`` at a stated efficiency).

The compute split comes from each layer's FLOPs for the models the zoo builds
(:func:`model_split`), timed on this host for a measured run under ``--validate``
(:func:`timed_split`), and from equal layers for the paper profiles.
Stragglers (:func:`parse_stragglers`, :func:`delay_factors`), on top of
``--slowdown`` (train's per-rank factors, parsed by train's own parser), never
speed a step up; the extra time is the ``delay`` phase, as ``--slowdown``
records it in train, and where a step spends it is each strategy's own
(:mod:`.strategies`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np

from syncbench.algorithms.codecs.powersgd import tensor_shapes as array_shapes
from syncbench.algorithms.local_optimizer import local_optimizer_name
from syncbench.algorithms.registry import get_algorithm
from syncbench.analysis.runfile import RunFileError, read_run
from syncbench.analysis.schema import PHASES
from syncbench.bench.data.text import VOCAB
from syncbench.kernels.flops import gemm_forward_per_sample
from syncbench.kernels.gpt import GPT, Block, Embedding, GPTSpec, LayerNorm, flops_per_token
from syncbench.kernels.layers import (
    BasicBlock,
    BatchNorm2d,
    Conv2d,
    GlobalAvgPool,
    Linear,
    MaxPool2d,
    ReLU,
)
from syncbench.kernels.zoo import build_model, parse_gpt_spec

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

PROFILES_FILE = Path(__file__).with_name("profiles.toml")

#: Input shape and class count of the datasets runs use (for the parameter count).
DATASET_SHAPES: dict[str, tuple[tuple[int, int, int], int]] = {
    "fashion-mnist": ((1, 28, 28), 10),
    "mnist": ((1, 28, 28), 10),
    "cifar10": ((3, 32, 32), 10),
    "synthetic": ((1, 28, 28), 10),
}
DATASET_SAMPLES = {"fashion-mnist": 60000, "mnist": 60000, "cifar10": 50000}

#: Layers assumed for a profile without a buildable model (equal sizes).
PROFILE_LAYERS = 50

#: Share of a step's compute that is the backward pass, for a profile without a
#: buildable model (a backward pass costs about twice its forward).
BACKWARD_SHARE = 2.0 / 3.0


@dataclass(frozen=True)
class ComputeSplit:
    """Where the hook calls of ``Model.loss_and_grad`` fall in one step's compute.

    ``forward[i]``: share of the compute done when ``poll`` runs after layer
    i's forward; ``backward[h]``: share done when the h-th ``on_grads_ready``
    runs (after layer L-1-h's backward), which reports ``offsets[h]``, the
    offset from which the flat gradient is final. Shares grow to 1 (the last
    backward call ends the compute).
    """

    forward: tuple[float, ...]
    backward: tuple[float, ...]
    offsets: tuple[int, ...]
    source: str = ""

    @property
    def hooks(self) -> np.ndarray:
        """Shares at every hook call of a step, in call order (forward, then backward)."""
        return np.asarray(self.forward + self.backward, dtype=float)


def _layer_cost(layer: Any, shape: tuple[int, ...], input_grad: bool
                ) -> tuple[float, float, tuple[int, ...]]:
    """(forward FLOPs, backward FLOPs, output shape) of one layer for one sample."""
    out = tuple(layer.output_shape(shape))
    if isinstance(layer, (Linear, Conv2d)):
        gemm = float(gemm_forward_per_sample(layer, shape))  # 2 FLOPs per multiply-add
        has_bias = isinstance(layer, Linear) or layer.bias
        bias = float(out[0] if isinstance(layer, Linear) else np.prod(out)) if has_bias else 0.0
        return gemm + bias, gemm + bias + (gemm if input_grad else 0.0), out
    if isinstance(layer, BasicBlock):  # its layers (all with input gradients), the sum, ReLU
        fwd = bwd = 0.0
        inner = shape
        for sub in layer.sublayers():
            f, b, inner = _layer_cost(sub, inner, True)
            fwd, bwd = fwd + f, bwd + b
        elems = float(np.prod(out))
        return fwd + 2 * elems, bwd + 2 * elems, out
    elems = float(np.prod(shape))
    if isinstance(layer, BatchNorm2d):  # normalize and scale; sums and the input gradient
        return 4 * elems, 6 * elems, out
    if isinstance(layer, (ReLU, MaxPool2d, GlobalAvgPool)):
        return elems, elems, out
    return 0.0, 0.0, out  # Flatten (a view) and layers without arithmetic


def layer_flops(model: Any) -> tuple[list[float], list[float], float]:
    """(forward FLOPs per layer, backward FLOPs per layer, loss FLOPs) for one sample.

    From the model definition (``kernels/layers.py``): a Linear or Conv2d
    costs 2 FLOPs per multiply-accumulate and one per bias element (if it
    has a bias); its backward computes the weight gradient (as many FLOPs)
    and the input gradient (again as many) except in the first layer with
    parameters (``needs_input_grad`` False, ``Model.first_trained``), and the
    layers below that one run no backward at all. A residual block costs its
    layers plus 2 operations per output element for the sum and its ReLU
    (each way); BatchNorm 4 per element forward, 6 backward; ReLU, MaxPool2d
    and global average pooling one per element each way; Flatten nothing;
    the softmax cross-entropy about 5 per logit. (``kernels/flops.py`` counts
    GEMMs only, for the roofline; this split needs every layer's share.)
    """
    forward, backward = [], []
    shape = tuple(model.input_shape)
    for index, layer in enumerate(model.layers):
        fwd, bwd, shape = _layer_cost(layer, shape, layer.needs_input_grad)
        forward.append(fwd)
        backward.append(bwd if index >= model.first_trained else 0.0)
    return forward, backward, 5.0 * model.num_classes


def model_split(model: Any) -> ComputeSplit:
    """The compute split of a built model, from :func:`layer_flops`.

    ``Model.loss_and_grad`` (``kernels/model.py``) calls ``poll`` after every
    layer's forward and ``on_grads_ready(layer_offsets[i])`` after every layer's
    backward, last layer first: where SSGD posts its buckets and where every
    strategy's ``Testall`` advances a nonblocking collective. The share of a
    step's compute before each call is from FLOPs, not measured per-layer times:
    FLOPs exist for every model the zoo builds and for a run file from any
    machine (which records no per-layer times), and timings of sub-millisecond
    layers on a shared machine move with the other jobs' load; measured
    per-layer medians are within about 0.1 of the FLOP shares (docs/RESULTS.md,
    "Per-layer compute shares"). Where the runs were made on the simulating host
    (``--validate``; ``--compute-split``), the calls are timed instead
    (:func:`timed_split`): a few hundredths of a step decided whether an ASGD owner
    served a push before its delay. The paper profiles (``resnet50`` ...) have no
    buildable model: :data:`PROFILE_LAYERS` layers of equal size, the backward
    :data:`BACKWARD_SHARE` of the compute (a backward costs about twice its
    forward: Kaplan et al. 2020, Sec. 2.1), the hook calls evenly spread.
    """
    if isinstance(model, GPT):  # layers of its own, hooks of its own: gpt_split
        return gpt_split(model.spec, model.vocab, model.name)
    forward, backward, loss = layer_flops(model)
    total = sum(forward) + sum(backward) + loss
    fwd = np.cumsum(forward) / total
    bwd = (sum(forward) + loss + np.cumsum(backward[::-1])) / total
    bwd[-1] = 1.0
    offsets = tuple(int(o) for o in model.layer_offsets[::-1])
    return ComputeSplit(tuple(float(f) for f in fwd), tuple(float(b) for b in bwd), offsets,
                        f"FLOPs per layer of {model.name}")


def gpt_flops(spec: GPTSpec, vocab: int) -> tuple[list[float], list[float], float]:
    """(forward FLOPs after each forward ``poll``, backward FLOPs of each layer in
    backward order, the output head's FLOPs) per token of the ``gpt`` of ``spec``.

    From :func:`syncbench.kernels.gpt.flops_per_token`, the count the model's own module
    gives (GEMMs and attention's two products, 2 FLOPs a multiply-add): a block costs
    ``blocks / L + attention / L`` forward and twice that backward (weight and input
    gradients), the tied output layer ``head`` forward (the logits) and twice that
    after the loss (``wte``'s gradient and the hidden state's); the embedding's gather
    and scatter and the LayerNorms are counted nowhere, as there. ``GPT._hidden`` polls
    after every block and after the final LayerNorm (not after the embedding), and
    ``GPT.loss_and_grad`` reports ``on_grads_ready`` after the final LayerNorm, each
    block from the last, then the embedding.
    """
    parts = flops_per_token(spec, vocab)
    block = float(parts["blocks"] + parts["attention"]) / spec.layers
    forward = [block] * spec.layers + [0.0]  # polls after each block, the final norm
    backward = [0.0] + [2.0 * block] * spec.layers + [0.0]  # final norm, blocks, embedding
    return forward, backward, 3.0 * float(parts["head"])


def gpt_layers(spec: GPTSpec, vocab: int) -> list[Any]:
    """The layers of the ``gpt`` of ``spec`` (``GPT.layers``), unbound: their shapes
    only, without the parameters (GPT-2 small's would take a gigabyte)."""
    return [Embedding(vocab, spec.ctx, spec.d),
            *[Block(spec.d, spec.heads, spec.layers) for _ in range(spec.layers)],
            LayerNorm(spec.d)]


def gpt_offsets(spec: GPTSpec, vocab: int) -> list[int]:
    """Where each layer's parameters start in the flat buffer (``GPT.layer_offsets``)."""
    sizes = [sum(math.prod(s) for s in layer.param_shapes())
             for layer in gpt_layers(spec, vocab)]
    return [int(o) for o in np.cumsum([0, *sizes[:-1]])]


#: Steps a timed split measures (the median share of each hook call counts), after two
#: untimed ones, and the seconds it may take (at least :data:`SPLIT_MIN_STEPS` steps).
SPLIT_STEPS, SPLIT_BUDGET_S, SPLIT_MIN_STEPS = 30, 3.0, 3


@functools.lru_cache(maxsize=8)
def timed_split(model: str, dataset: str, batch_size: int) -> ComputeSplit | None:
    """Where the hook calls of ``model``'s ``loss_and_grad`` fall in a step on this host:
    a random batch of ``batch_size``, each call's time since the step began over the
    step's, the median of up to :data:`SPLIT_STEPS` steps (within :data:`SPLIT_BUDGET_S`,
    the two untimed ones in it), the shares kept in order and the last backward call at 1;
    the FLOP split's gradient offsets. None where the calls are not :func:`model_split`'s
    (another count).

    Why timed: FLOPs misplace the convolutions' backward. On an AMD EPYC KVM guest lenet's
    last backward calls (conv2's and conv1's) came at 0.82 and 0.90 of a step where FLOPs
    put them at 0.89 and 0.90, and its third forward call at 0.27, not 0.11; ASGD's slow
    owner then polled 7.9 ms into a 9.6 ms compute, not 8.6, and a free rank's push to
    it, which needs two polls, was served before the owner's unpolled delay. ASGD on
    lenet at 1 Gbit/s with a 2x slower rank in work mode, predicted 13-17% slow from the
    FLOP split in five sets on two processors, came out 4-8% slow from the timed one in
    two; the same runs at a quota moved from +1% and -0% to +18% and +5% (docs/RESULTS.md,
    "Hook calls timed, D-PSGD at a quota and the links' bucket")."""
    built = build_zoo_model(model, dataset)
    flops = model_split(built)
    rng = np.random.default_rng(0)
    if hasattr(built, "scratch_batch"):  # a language model: token windows
        x, y = built.scratch_batch(rng, batch_size)
    else:
        x = rng.standard_normal((batch_size, *built.input_shape)).astype(built.dtype)
        y = rng.integers(0, built.num_classes, size=batch_size)
    marks: list[float] = []

    def mark(*_: Any) -> None:
        marks.append(time.perf_counter())

    shares: list[list[float]] = []
    began = time.perf_counter()  # the untimed steps count against the budget too
    for i in range(SPLIT_STEPS + 2):
        marks.clear()
        start = time.perf_counter()
        built.loss_and_grad(x, y, on_grads_ready=mark, poll=mark)
        end = time.perf_counter()
        if i >= 2:
            shares.append([(m - start) / max(end - start, 1e-12) for m in marks])
            if len(shares) >= SPLIT_MIN_STEPS and end - began > SPLIT_BUDGET_S:
                break
    if any(len(row) != len(flops.hooks) for row in shares):
        return None
    med = np.clip(np.maximum.accumulate(np.median(np.asarray(shares), axis=0)), 0.0, 1.0)
    forward = len(flops.forward)
    return ComputeSplit(
        forward=tuple(float(v) for v in med[:forward]),
        backward=tuple(float(v) for v in med[forward:-1]) + (1.0,), offsets=flops.offsets,
        source=f"timed on this host: the median of {len(shares)} steps of {model} at batch "
        f"{batch_size}")


def timed_split_refusal(workload: Workload) -> str | None:
    """Why ``workload``'s split is not timed on this host (None: it can be): a profile
    without a model, a run on a GPU (the host times the CPU's layers), or steps so long
    that the untimed and the fewest timed ones would not fit :data:`SPLIT_BUDGET_S`."""
    if workload.split is None:
        return "a profile without a model to time"
    backend = str(workload.extra.get("backend", "numpy"))
    if backend != "numpy":
        return f"the run computed with {backend}, not on this host's CPU"
    step = (float(np.mean(workload.rows[:, 1])) if workload.rows is not None
            else workload.mean_compute_s)
    if step * (2 + SPLIT_MIN_STEPS) > SPLIT_BUDGET_S:
        return (f"its steps ({step:.2f} s of compute) are too long to time "
                f"{2 + SPLIT_MIN_STEPS} in {SPLIT_BUDGET_S:g} s")
    return None


def with_timed_split(workload: Workload) -> Workload:
    """``workload`` with its split timed on this host (:func:`timed_split`); itself where
    that cannot be had (:func:`timed_split_refusal`, another count of hook calls)."""
    if timed_split_refusal(workload) is not None:
        return workload
    dataset = str(workload.extra.get("dataset", "fashion-mnist"))
    split = timed_split(workload.name, dataset, int(workload.batch_size))
    return workload if split is None else dataclasses.replace(workload, split=split)


def gpt_split(spec: GPTSpec, vocab: int, name: str = "") -> ComputeSplit:
    """The compute split of the ``gpt`` of ``spec`` (:func:`gpt_flops`): forward shares at
    its polls, then the head, then backward shares at each ``on_grads_ready`` in the
    order backward reports them, so SSGD's buckets become ready where they do."""
    forward, backward, head = gpt_flops(spec, vocab)
    total = sum(forward) + head + sum(backward)
    fwd = np.cumsum(forward) / total
    bwd = (sum(forward) + head + np.cumsum(backward)) / total
    bwd[-1] = 1.0
    offsets = tuple(gpt_offsets(spec, vocab)[::-1])
    return ComputeSplit(tuple(float(f) for f in fwd), tuple(float(b) for b in bwd), offsets,
                        f"FLOPs per block of {name or spec} (kernels/gpt.py flops_per_token)")


def profile_split(params: int, layers: int = PROFILE_LAYERS) -> ComputeSplit:
    """The assumed split of a profile without a model: ``layers`` equal layers, the
    backward :data:`BACKWARD_SHARE` of the compute, hook calls evenly spread."""
    fwd_share = 1.0 - BACKWARD_SHARE
    forward = tuple(fwd_share * (i + 1) / layers for i in range(layers))
    backward = tuple(fwd_share + BACKWARD_SHARE * (h + 1) / layers for h in range(layers))
    offsets = tuple(params * i // layers for i in reversed(range(layers)))
    return ComputeSplit(forward, backward[:-1] + (1.0,), offsets,
                        f"assumed: {layers} equal layers, backward {BACKWARD_SHARE:.3g} of compute")


@dataclass
class Workload:
    """Per-step local work of one model."""

    name: str
    params: int
    batch_size: int
    dataset_samples: int
    itemsize: int = 4
    #: Measured rows to replay: columns data, compute, update (seconds), measured
    #: ranks one after the other (``rank_bounds``). A row's data holds its step's time
    #: between phases too (:func:`between_phases`): the loop's own work, which every
    #: strategy's step does, is replayed where the step's data is.
    rows: np.ndarray | None = None
    #: Start of each measured rank's rows in ``rows``, and the end (R + 1 entries).
    rank_bounds: list[int] = field(default_factory=list)
    #: Measured delay / compute of each row (0 where the rank was not slowed).
    delay_ratio: np.ndarray | None = None
    #: Else lognormal compute with this mean and coefficient of variation.
    mean_compute_s: float = 0.0
    cv: float = 0.0
    mean_data_s: float = 0.0
    mean_update_s: float = 0.0
    #: A measured run's mean ``t_codec`` per step and rank over the replayed rows (0: it
    #: ran no codec, or was written before the column, when its update holds the codec).
    mean_codec_s: float = 0.0
    #: A measured run's mean ``t_comm + t_wait`` per step and rank over the replayed rows:
    #: for a 1-rank codec run, what the harness costs around its collectives (nothing
    #: moves), which ``--calibrate-after-step`` leaves out (:mod:`.after_step`).
    mean_calls_s: float = 0.0
    #: A measured run's mean time between phases per step and rank over the replayed
    #: rows (:func:`between_phases`; already in each row's data).
    mean_between_s: float = 0.0
    #: A compressed run's time between phases beyond this workload's, per step and rank:
    #: the compressing reducer's own work outside its codec phase, which ``--validate``
    #: takes from the codec's ``--compressed-workload`` and a compressed step pays with
    #: its codec (:func:`.compressed.codec_cost`).
    codec_between_s: float = 0.0
    source: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: Offset of each layer's parameters in the flat buffer (SSGD's bucket plan);
    #: empty: ``PROFILE_LAYERS`` layers of equal size.
    layer_offsets: list[int] = field(default_factory=list)
    #: Where the hook calls fall in a step's compute (None: :func:`profile_split`).
    split: ComputeSplit | None = None
    #: Every parameter array's shape in flat-buffer order (PowerSGD's layout); empty for
    #: a profile without a buildable model.
    tensor_shapes: list[tuple[int, ...]] = field(default_factory=list)

    def offsets(self) -> list[int]:
        if self.layer_offsets:
            return list(self.layer_offsets)
        return [self.params * i // PROFILE_LAYERS for i in range(PROFILE_LAYERS)]

    def compute_split(self) -> ComputeSplit:
        """The model's split, or the assumed one of a profile without a model."""
        return self.split if self.split is not None else profile_split(self.params)

    @property
    def param_bytes(self) -> float:
        return float(self.params * self.itemsize)

    def describe(self) -> dict[str, Any]:
        """The attributes recorded in a simulated run file."""
        out = {"name": self.name, "params": self.params, "batch_size": self.batch_size,
               "itemsize": self.itemsize, "source": self.source,
               "compute_split": self.compute_split().source}
        if self.rows is not None:
            out.update(rows=len(self.rows), mean_step_s=float(self.rows.sum(axis=1).mean()),
                       replay="per rank, in order, cycling from a random row")
        else:
            out.update(mean_compute_s=self.mean_compute_s, cv=self.cv)
        return {**out, **self.extra}

    def scaled(self, factor: float, codec_factor: float | None = None) -> Workload:
        """This workload on a host ``factor`` times slower: every replayed row's data,
        compute and update, the profile's means and the codec's cost times ``factor``
        (a measured delay follows its compute: it is replayed as a ratio), and the harness's
        cost around the calls and the time between phases; the codec's cost times
        ``codec_factor`` where given."""
        rows = None if self.rows is None else self.rows * np.array([factor] * 3)
        codec = factor if codec_factor is None else codec_factor
        return dataclasses.replace(
            self, rows=rows, mean_compute_s=self.mean_compute_s * factor,
            mean_data_s=self.mean_data_s * factor, mean_update_s=self.mean_update_s * factor,
            mean_codec_s=self.mean_codec_s * codec, mean_calls_s=self.mean_calls_s * factor,
            mean_between_s=self.mean_between_s * factor,
            codec_between_s=self.codec_between_s * factor)

    def scaled_ranks(self, factors: list[float], codec_factor: float) -> Workload:
        """This workload with measured rank ``m``'s replayed rows (data, compute, update)
        ``factors[m]`` times as long: a host whose CPUs ran at different speeds during a
        run (:func:`syncbench.bench.simulate.validate.rank_host_factors`). The profile's
        means and the harness's cost take the factors' mean, the codec's cost
        ``codec_factor``. One factor per measured rank, as many as ``rank_bounds`` holds."""
        bounds = self.rank_bounds
        if self.rows is None or len(factors) != len(bounds) - 1:
            raise ValueError(f"scaled_ranks: {len(factors)} factor(s) for "
                             f"{max(len(bounds) - 1, 0)} measured rank(s)")
        rows = self.rows.copy()
        for (lo, hi), factor in zip(zip(bounds[:-1], bounds[1:]), factors):
            rows[lo:hi] *= factor
        return dataclasses.replace(self.scaled(float(np.mean(factors)), codec_factor),
                                   rows=rows)

    def pooled(self) -> Workload:
        """This workload with every measured rank's rows scaled to the ranks' common mean:
        each rank's data, compute and update, column by column, times the mean of the
        ranks' means over its own, so each rank keeps its step-to-step variation and order
        but none keeps a speed of its own. Itself where there is one rank or no rows, or
        where the ranks did not all run alike: a rank that was slowed (a measured
        ``delay``) or ranks on nodes of different speeds (``rank_node_speeds``) have the
        speeds they were measured for."""
        bounds = self.rank_bounds
        speeds = self.extra.get("rank_node_speeds") or []
        if (self.rows is None or len(bounds) < 3 or min(np.diff(bounds)) < 1
                or (self.delay_ratio is not None and np.any(self.delay_ratio > 0))
                or len(set(speeds)) > 1):
            return self
        own = self._rank_row_means()
        common = own.mean(axis=0)
        rows = self.rows.copy()
        for (lo, hi), mine in zip(zip(bounds[:-1], bounds[1:]), own):
            rows[lo:hi] *= np.divide(common, mine, out=np.ones(3), where=mine > 0)
        # recorded in the simulated run file's workload attribute (describe)
        return dataclasses.replace(self, rows=rows,
                                   extra={**self.extra, "ranks_pooled": True})

    def _rank_row_means(self) -> np.ndarray:
        """Each measured rank's mean data, compute and update (ranks x 3) over its rows."""
        bounds = self.rank_bounds
        return np.array([self.rows[lo:hi].mean(axis=0)
                         for lo, hi in zip(bounds[:-1], bounds[1:])]).reshape(-1, 3)

    def rank_means(self) -> list[float]:
        """Each measured rank's mean compute (seconds) over its replayed rows."""
        if self.rows is None:
            return []
        return [float(m) for m in self._rank_row_means()[:, 1]]

    def with_update(self, factor: float) -> Workload:
        """This workload with every replayed row's update (and the profile's mean update)
        ``factor`` times as long: another local optimizer's step (:mod:`.local_update`)."""
        rows = None if self.rows is None else self.rows * np.array([1.0, 1.0, factor])
        return dataclasses.replace(self, rows=rows, mean_update_s=self.mean_update_s * factor)

    @property
    def node_speed(self) -> float:
        """The CPU share of the node the workload was measured on (``extra["node_speed"]``,
        :func:`measured_node_speed`; 1 for a profile): the speed its rows stand for."""
        return float(self.extra.get("node_speed", 1.0))

    def median_compute_s(self) -> float:
        """The replayed rows' median compute (the profile's mean without rows)."""
        if self.rows is None or not len(self.rows):
            return self.mean_compute_s
        return float(np.median(self.rows[:, 1]))

    def replay_offsets(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Each simulated rank's starting row in its measured rank's rows (0 for profiles)."""
        if self.rows is None:
            return np.zeros(n, dtype=np.int64)
        lengths = np.diff(self.rank_bounds)[np.arange(n) % (len(self.rank_bounds) - 1)]
        return rng.integers(0, lengths)

    def draw(self, rng: np.random.Generator, n: int, start: int, count: int,
             offsets: np.ndarray | None = None) -> np.ndarray:
        """Local seconds of steps ``start .. start+count-1`` of ``n`` ranks, shape
        ``(n, count, 4)``: data, compute, update and the measured delay of each step.

        A run file's rows are replayed (``offsets`` from :meth:`replay_offsets`):
        simulated rank k replays measured rank k mod R's rows (the first two steps
        of each rank and OD-SGD's warm-up left out) in their order, cycling, from a
        random starting row of its own. A measured rank's rows carry its persistent
        speed (a slowed rank, a slower core) and their order the run's bursts
        (another job's load, a garbage collection); pooling them over ranks and
        resampling each step would spread one slow rank's steps over every
        simulated rank as independent noise. The random start keeps the ranks that
        replay the same measured rank from slowing down in lock step. The measured
        ``delay`` is replayed as its ratio to the row's compute, so
        ``--batch-size`` scales it with the compute. A profile's compute is
        lognormal, each step
        drawn on its own.
        """
        out = np.zeros((n, count, 4))
        if self.rows is not None:
            bounds = np.asarray(self.rank_bounds)
            measured = np.arange(n) % (len(bounds) - 1)
            first, length = bounds[measured], np.diff(bounds)[measured]
            base = np.zeros(n, dtype=np.int64) if offsets is None else offsets
            steps = np.arange(start, start + count)
            idx = first[:, None] + (base[:, None] + steps) % length[:, None]
            out[..., :3] = self.rows[idx]
            if self.delay_ratio is not None:
                out[..., 3] = self.delay_ratio[idx] * out[..., 1]
            return out
        out[..., 0] = self.mean_data_s
        out[..., 2] = self.mean_update_s
        if self.cv > 0:
            sigma = math.sqrt(math.log1p(self.cv ** 2))
            out[..., 1] = self.mean_compute_s * rng.lognormal(-sigma ** 2 / 2, sigma, (n, count))
        else:
            out[..., 1] = self.mean_compute_s
        return out


def build_zoo_model(model: str, dataset: str) -> Any:
    """``model`` on ``dataset``'s inputs, built once on the CPU (``kernels.zoo.build_model``;
    a ``gpt`` on its context of byte tokens, whatever the corpus)."""
    spec = parse_gpt_spec(model)
    if spec is not None:
        return build_model(model, (spec.ctx,), VOCAB)
    shape, classes = DATASET_SHAPES.get(dataset, ((1, 28, 28), 10))
    return build_model(model, shape, classes)


def model_tensor_shapes(built: Any) -> list[tuple[int, ...]]:
    """A built model's parameter shapes in flat-buffer order (``tensor_shapes``, which
    PowerSGD's reducer lays its matrices out by)."""
    return array_shapes([layer.param_shapes() for layer in built.layers], built.layer_offsets)


def model_layout(model: str, dataset: str) -> tuple[int, list[int]]:
    """(parameters, layer offsets) of ``model`` on ``dataset``'s inputs (built once, on CPU)."""
    built = build_zoo_model(model, dataset)
    return int(built.size), [int(o) for o in built.layer_offsets]


def between_phases(cols: dict[str, np.ndarray]) -> np.ndarray:
    """Each step's seconds outside its phases: from its start to the next step's start,
    less every phase it timed. That is the training loop's own work between phases (the
    row's record, the hooks' checks, the phase timer's reads), 0.05-0.46 ms a step on the
    emulated nodes (docs/RESULTS.md, "The time between a step's phases"). The last step
    (no next start) and a pause (an evaluation, a checkpoint: longer than the step's
    phases together) take the rank's median; never negative (clock rounding)."""
    starts = np.asarray(cols["t_start"], dtype=float)
    zeros = np.zeros(len(starts))
    if len(starts) < 2:
        return zeros
    phases = sum(np.asarray(cols.get(f"t_{p}", zeros), dtype=float) for p in PHASES)
    gap = np.append(np.maximum(np.diff(starts) - phases[:-1], 0.0), np.nan)
    gap[gap > phases] = np.nan
    median = float(np.nanmedian(gap)) if np.any(np.isfinite(gap)) else 0.0
    return np.where(np.isfinite(gap), gap, median)


def from_run(path: str) -> Workload:
    """The workload of a measured run file: its rows (replayed by :meth:`Workload.draw`),
    its model rebuilt from ``--model`` and the dataset shape, batch and dataset from its
    config."""
    try:
        run = read_run(path)
    except RunFileError as exc:
        raise ValueError(f"--workload {exc}") from None
    if run.attrs.get("simulated"):
        raise ValueError(f"--workload {path}: is a simulated run; give a measured one")
    skip = 2 + int(run.attrs.get("warmup_steps", 0) or 0)
    parts, ratios, codecs, calls, betweens, bounds = [], [], [], [], [], [0]
    for rank in sorted(run.ranks):
        cols = run.ranks[rank]
        keep = slice(skip, None) if len(cols["step"]) > skip + 2 else slice(None)
        between = between_phases(cols)[keep]
        part = np.stack([cols["t_data"][keep] + between,
                         cols["t_compute"][keep], cols["t_update"][keep]], axis=1).astype(float)
        if len(part) == 0:
            continue
        betweens.append(np.asarray(between, dtype=float))
        compute = np.maximum(part[:, 1], 1e-12)
        parts.append(part)
        codecs.append(np.asarray(cols["t_codec"][keep], dtype=float))
        calls.append(np.asarray(cols["t_comm"][keep], dtype=float)
                     + np.asarray(cols["t_wait"][keep], dtype=float))
        ratios.append(np.asarray(cols["t_delay"][keep], dtype=float) / compute)
        bounds.append(bounds[-1] + len(part))
    if not parts:
        raise ValueError(f"--workload {path}: has no step rows")
    config = run.config
    model = str(run.attrs.get("model") or config.get("model") or "mlp")
    dataset = str(run.attrs.get("dataset") or config.get("dataset") or "fashion-mnist")
    itemsize = 8 if config.get("dtype") == "float64" else 4
    samples = DATASET_SAMPLES.get(dataset, int(config.get("synthetic_samples", 8192)))
    built = build_zoo_model(model, dataset)
    return Workload(name=model, params=int(built.size),
                    layer_offsets=[int(o) for o in built.layer_offsets],
                    batch_size=int(config.get("batch_size", 64)), dataset_samples=samples,
                    itemsize=itemsize, rows=np.concatenate(parts), rank_bounds=bounds,
                    delay_ratio=np.concatenate(ratios), source=str(path),
                    mean_codec_s=float(np.mean(np.concatenate(codecs))),
                    mean_calls_s=float(np.mean(np.concatenate(calls))),
                    mean_between_s=float(np.mean(np.concatenate(betweens))),
                    split=model_split(built), tensor_shapes=model_tensor_shapes(built),
                    extra={"dataset": dataset, "measured_world_size": run.world_size,
                           "backend": str(run.attrs.get("backend") or "numpy"),
                           "compress": str(config.get("compress", "none") or "none"),
                           "optimizer": run_optimizer(run.algorithm, config.get("optimizer")),
                           "node_speed": measured_node_speed(run),
                           "rank_node_speeds": [node_speed_of(run.rank_attrs.get(rank, {}))
                                                for rank in sorted(run.ranks)]})


def run_optimizer(algorithm: str, chosen: Any) -> str | None:
    """The local optimizer a measured run stepped with (``--optimizer``, else its
    strategy's default: ``local_optimizer_name``, train's rule); None for a strategy this
    version does not know that chose none."""
    try:
        traits = get_algorithm(algorithm).traits
    except ValueError:  # a strategy this version does not know
        return str(chosen) if chosen else None
    return local_optimizer_name(SimpleNamespace(optimizer=chosen or None), traits)


def rank_factor(attrs: dict[str, Any], name: str) -> float:
    """A rank attribute that is a positive factor (``slowdown``, ``node_speed``,
    ``slowdown_realised``); 1 where absent, not a number, or not positive and finite."""
    try:
        value = float(attrs.get(name, 1.0))
    except (TypeError, ValueError):
        return 1.0
    return value if math.isfinite(value) and value > 0 else 1.0


def node_speed_of(attrs: dict[str, Any]) -> float:
    """A rank's node speed (its CPU share, ``node_speed``): in (0, 1], 1 where absent."""
    speed = rank_factor(attrs, "node_speed")
    return speed if speed <= 1.0 else 1.0


def measured_node_speed(run: Any) -> float:
    """The CPU share of the node a workload run was measured on (its ranks' slowest
    ``node_speed`` attribute; 1 where absent): the speed its rows stand for."""
    return min((node_speed_of(attrs) for attrs in run.rank_attrs.values()), default=1.0)


def load_profiles() -> dict[str, Any]:
    with open(PROFILES_FILE, "rb") as f:
        return tomllib.load(f)


def from_profile(name: str, device: str | None = None, device_flops: float | None = None,
                 efficiency: float | None = None) -> Workload:
    """The workload of a named profile (``ValueError`` with one line if it cannot be built).

    A measured profile gives the median compute ``compute_seconds`` and the
    standard deviation ``compute_sigma`` of its logarithm; the lognormal
    drawn per step has that median (its mean is median * exp(sigma^2 / 2)). Its
    ``between_seconds``, a step's time outside its phases (:func:`between_phases`), is
    replayed with its data, as a run file's is.
    """
    profiles = load_profiles()
    models, devices = profiles.get("model", {}), profiles.get("device", {})
    if name not in models:
        raise ValueError(f"--workload {name!r}: not a run file or a profile; profiles: "
                         f"{', '.join(sorted(models))}")
    p = models[name]
    extra: dict[str, Any] = {}
    offsets: list[int] = []
    split, shapes = None, []
    if name in ("mlp", "lenet"):
        built = build_zoo_model(name, "fashion-mnist")
        offsets, split = [int(o) for o in built.layer_offsets], model_split(built)
        shapes = model_tensor_shapes(built)
    gpt = parse_gpt_spec(str(p.get("model", "")))
    if gpt is not None:  # the transformer's layers, without building its parameters
        vocab = int(p.get("vocab", VOCAB))
        offsets, split = gpt_offsets(gpt, vocab), gpt_split(gpt, vocab, name)
        shapes = array_shapes([layer.param_shapes() for layer in gpt_layers(gpt, vocab)])
        if offsets and sum(math.prod(s) for s in shapes) != int(p["params"]):
            raise ValueError(f"--workload {name}: profiles.toml's model {p['model']} has "
                             f"{sum(math.prod(s) for s in shapes)} parameters, not {p['params']}")
    if "compute_seconds" in p:
        sigma = float(p.get("compute_sigma", 0.0))
        mean_compute = float(p["compute_seconds"]) * math.exp(sigma ** 2 / 2)
        cv = math.sqrt(math.expm1(sigma ** 2))
    else:
        mean_compute = _flop_compute_seconds(name, p, devices, device, device_flops,
                                             efficiency, extra)
        cv = float(p.get("cv", 0.02))
    return Workload(name=name, params=int(p["params"]), batch_size=int(p["batch_size"]),
                    dataset_samples=int(p.get("dataset_samples", 60000)),
                    mean_compute_s=mean_compute, cv=cv,
                    mean_data_s=float(p.get("data_seconds", 0.0))
                    + float(p.get("between_seconds", 0.0)),
                    mean_update_s=float(p.get("update_seconds", 0.0)),
                    source=f"profile {name}: {p.get('source', '')}", extra=extra,
                    layer_offsets=offsets, split=split, tensor_shapes=shapes)


def _flop_compute_seconds(name: str, p: dict[str, Any], devices: dict[str, Any],
                          device: str | None, device_flops: float | None,
                          efficiency: float | None, extra: dict[str, Any]) -> float:
    """A FLOP profile's compute seconds per step on the chosen device (notes in ``extra``)."""
    if device_flops is None:
        if device is None:
            raise ValueError(f"--workload {name}: needs --hardware-flops F or --hardware "
                             f"({', '.join(sorted(devices))})")
        if device not in devices:
            raise ValueError(f"--hardware {device!r}: choose one of "
                             f"{', '.join(sorted(devices))}")
        d = devices[device]
        eff = float(efficiency if efficiency is not None else d["efficiency"])
        device_flops = float(d["peak_flops"]) * eff
        extra.update(device=device, efficiency=eff)
    extra["device_flops"] = device_flops
    return int(p["batch_size"]) * float(p["train_flops_per_sample"]) / device_flops


# -- stragglers -------------------------------------------------------------------

@dataclass(frozen=True)
class Stragglers:
    """A parsed ``--stragglers`` model."""

    spec: str = ""
    every_sigma: float = 0.0  # lognormal:SIGMA on every step
    persistent_share: float = 0.0  # P/Q:Fx
    persistent_factor: float = 1.0
    transient_share: float = 0.0  # P/Q:lognormal:SIGMA
    transient_sigma: float = 0.0


def parse_stragglers(spec: str | None) -> Stragglers:
    """``lognormal:SIGMA``, ``P/Q:Fx`` or ``P/Q:lognormal:SIGMA``, comma-separated.

    ``lognormal:SIGMA`` scales every rank's every step by exp(|N(0, SIGMA^2)|);
    ``P/Q:Fx`` slows round(N*P/Q) randomly chosen ranks by F for the whole run;
    ``P/Q:lognormal:SIGMA`` slows each step of each rank with probability P/Q by
    exp(|N(0, SIGMA^2)|) (a transient straggler: OS noise, a garbage collection,
    a throttled GPU). One-sided (the logarithm of the factor is half-normal)
    rather than clipped at 1, so the factor has no atom at 1 and one rule serves
    both: its median is exp(0.6745 SIGMA) (1.96x at SIGMA 1, 1.40x at 0.5) and
    SIGMA 0 means no slowdown. (The factor before, 1 + exp(N(0, SIGMA^2)) for the
    transient, had a median of 2x whatever SIGMA, and exp(N(0, SIGMA^2)) on every
    step sped half the steps up.)
    """
    if not spec:
        return Stragglers()
    fields: dict[str, Any] = {"spec": spec}
    for item in spec.split(","):
        parts = item.strip().split(":")
        try:
            if parts[0] == "lognormal" and len(parts) == 2:
                fields["every_sigma"] = float(parts[1])
                ok = fields["every_sigma"] >= 0
            elif len(parts) == 2 and parts[1].endswith("x"):
                fields["persistent_share"] = float(Fraction(parts[0]))
                fields["persistent_factor"] = float(parts[1][:-1])
                ok = 0 <= fields["persistent_share"] <= 1 and fields["persistent_factor"] >= 1
            elif len(parts) == 3 and parts[1] == "lognormal":
                fields["transient_share"] = float(Fraction(parts[0]))
                fields["transient_sigma"] = float(parts[2])
                ok = 0 <= fields["transient_share"] <= 1 and fields["transient_sigma"] >= 0
            else:
                ok = False
        except (ValueError, ZeroDivisionError):
            ok = False
        if not ok:
            raise ValueError(f"--stragglers {spec!r}: expected lognormal:SIGMA, P/Q:Fx (F >= 1) "
                             f"or P/Q:lognormal:SIGMA, got {item!r}")
    return Stragglers(**fields)


def one_sided_lognormal(rng: np.random.Generator, sigma: float,
                        size: int | tuple[int, ...]) -> np.ndarray:
    """exp(|N(0, sigma^2)|): a slowdown factor >= 1 with median exp(0.6745 sigma)."""
    return np.exp(np.abs(rng.normal(0.0, sigma, size)))


def delay_factors(model: Stragglers, base: np.ndarray, rng: np.random.Generator,
                  shape: tuple[int, int]) -> np.ndarray:
    """Per rank and step, the factor compute is stretched by (>= 1; ``base``: --slowdown).

    Every random factor is one-sided (:func:`one_sided_lognormal`, see
    :func:`parse_stragglers`), so a straggler never speeds a step up.
    """
    n, steps = shape
    factor = np.repeat(np.asarray(base, dtype=float)[:, None], steps, axis=1)
    if model.every_sigma > 0:
        factor *= one_sided_lognormal(rng, model.every_sigma, shape)
    if model.persistent_share > 0:
        count = int(round(n * model.persistent_share))
        slow = rng.choice(n, size=count, replace=False) if count else []
        factor[slow] *= model.persistent_factor
    if model.transient_share > 0:
        hit = rng.random(shape) < model.transient_share
        factor[hit] *= one_sided_lognormal(rng, model.transient_sigma, int(hit.sum()))
    return np.maximum(factor, 1.0)
