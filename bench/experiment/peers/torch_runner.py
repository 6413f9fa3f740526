"""PyTorch peer of ``syncbench train``: DDP (for SSGD) and periodic model averaging (Local SGD).

Launched like our own runs, one process per rank under ``mpiexec``
(``python -m syncbench.bench.experiment.peers.torch_runner ...``, the
runner's ``torch`` program). The rank and world size come from the
launcher's environment (Hydra's ``PMI_RANK``/``PMI_SIZE``, Open MPI's
``OMPI_COMM_WORLD_RANK``/``_SIZE``, ``PMIX_RANK``, ``SLURM_PROCID``/
``SLURM_NTASKS``, or ``RANK``/``WORLD_SIZE``); PyTorch's process group is
``gloo`` from ``env://`` with ``MASTER_ADDR`` and ``MASTER_PORT`` (the caller
picks a free port). No MPI call is made here.

Everything the throughput depends on matches ``syncbench train`` with the
same flags: the model (the architectures of :mod:`syncbench.kernels.zoo`:
``mlp``, ``lenet``, and the CIFAR ResNets of He et al. 2016, Sec. 4.2), the
data and each rank's shard and batches (the same ``BatchStream``, fetched
inside the timed loop), the optimizer (momentum SGD with L2 weight decay,
mean cross-entropy) and the steps (``max(1, int(epochs * steps_per_epoch))``
per rank); :func:`train` gives the details. ``ssgd`` is
``DistributedDataParallel`` (Li et al. 2020, "PyTorch Distributed", Sec. 3),
``localsgd`` ``PeriodicModelAverager`` (Lin et al. 2020, eq. (2)); ``ssgd
--compress`` registers PyTorch's own DDP communication hook
(:func:`register_compress_hook`: fp16, PowerSGD); BatchNorm
follows docs/ALGORITHMS.md (per-rank statistics, averaged with the weights
under Local SGD).

Timing: a barrier, then the loop (data, forward, backward, communication,
update) on every rank; the wall time is the slowest rank's, and samples/s is
``steps * batch * world / wall``, as the ``samples_per_s`` of our run files.
Rank 0 then evaluates on the test split (untimed) and prints one line
``peer-result {json}`` (with ``--out PATH`` also written there, atomically:
the peer's run file, which the experiment runner reads and keeps).
"""

from __future__ import annotations

import argparse
import functools
import io
import json
import math
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from syncbench.bench.data.catalog import DATASETS, load_dataset
from syncbench.bench.data.text import VOCAB
from syncbench.bench.experiment.peers.torch_gpt import build_torch_gpt
from syncbench.bench.files import write_atomic
from syncbench.bench.micro.speed import SHAPES, timed_model
from syncbench.bench.train.stream import BatchStream
from syncbench.kernels.zoo import parse_gpt_spec

#: The peer each of our algorithms is compared with.
PEERS = {"ssgd": "torch-ddp", "localsgd": "torch-periodic-avg"}
#: Basic blocks per stage of the CIFAR ResNets (depth 6n + 2, He et al. 2016, Sec. 4.2).
RESNET_BLOCKS = {"resnet8": 1, "resnet20": 3}
#: The models the peer builds (:func:`build_torch_model`).
MODELS = ("mlp", "lenet", *RESNET_BLOCKS)
#: Channels of the three ResNet stages.
RESNET_WIDTHS = (16, 32, 64)
RESULT_PREFIX = "peer-result "

#: (rank, size) environment variables of the launchers, tried in order.
_RANK_ENV = (
    ("PMI_RANK", "PMI_SIZE"),
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("PMIX_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("SLURM_PROCID", "SLURM_NTASKS"),
    ("RANK", "WORLD_SIZE"),
)


@dataclass
class PeerResult:
    """What rank 0 reports (one JSON line)."""

    peer: str
    algorithm: str
    model: str
    world_size: int
    steps: int
    batch_size: int
    wall_s: float
    samples_per_s: float
    first_loss: float
    last_loss: float
    test_loss: float
    accuracy: float
    torch_version: str
    threads: int
    #: The DDP communication hook (``--compress``): none, fp16, bf16 or powersgd:R.
    compress: str = "none"


def rank_and_size(environ: dict[str, str] | None = None) -> tuple[int, int]:
    """This process's rank and the world size, from the launcher's environment."""
    env = os.environ if environ is None else environ
    for rank_var, size_var in _RANK_ENV:
        if rank_var in env and size_var in env:
            return int(env[rank_var]), int(env[size_var])
    return 0, 1


def build_torch_model(name: str, input_shape: Sequence[int], num_classes: int) -> Any:
    """One of :data:`MODELS` as a ``torch.nn.Sequential`` (the layers of kernels/zoo.py).

    ``mlp`` and ``lenet`` keep PyTorch's default initialisation; the ResNets
    are built by :func:`build_torch_resnet` with the suite's.
    """
    from torch import nn  # lazy: PyTorch is optional

    channels, height, width = input_shape
    if name in RESNET_BLOCKS:
        if (height, width) not in ((28, 28), (32, 32)):  # the zoo's rule
            raise ValueError(f"resnet takes 28x28 or 32x32 inputs, got {height}x{width}")
        return build_torch_resnet(RESNET_BLOCKS[name], channels, num_classes)
    if name == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(channels * height * width, 256), nn.ReLU(),
            nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, num_classes))
    if name == "lenet":
        if (height, width) not in ((28, 28), (32, 32)):
            raise ValueError(f"lenet takes 28x28 or 32x32 inputs, got {height}x{width}")
        pad = 2 if height == 28 else 0
        return nn.Sequential(
            nn.Conv2d(channels, 6, 5, padding=pad), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
            nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(),
            nn.Linear(84, num_classes))
    raise ValueError(f"unknown model {name!r}; choose {', '.join(MODELS)}")


@functools.cache
def _resnet_modules() -> tuple[type, type]:
    """``(ShortcutA, BasicBlock)``, defined on first use (torch is imported lazily)."""
    from torch import nn  # lazy: PyTorch is optional
    from torch.nn import functional as F

    class ShortcutA(nn.Module):
        """He et al.'s option A: ``x[:, :, ::s, ::s]``, zero channels appended after x's."""

        def __init__(self, stride: int, extra_channels: int) -> None:
            super().__init__()
            self.stride, self.extra_channels = stride, extra_channels

        def forward(self, x: Any) -> Any:
            if self.stride != 1:
                x = x[:, :, ::self.stride, ::self.stride]
            # (left, right) pads of width, height, channels: zeros after the last channel
            return F.pad(x, (0, 0, 0, 0, 0, self.extra_channels)) if self.extra_channels else x

        def extra_repr(self) -> str:
            return f"stride={self.stride}, extra_channels={self.extra_channels}"

    class BasicBlock(nn.Module):
        """conv3x3(stride) - BN - ReLU - conv3x3 - BN, plus the shortcut, then ReLU."""

        def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(out_channels, eps=1e-5, momentum=0.1)
            self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(out_channels, eps=1e-5, momentum=0.1)
            same = stride == 1 and in_channels == out_channels
            self.shortcut = (nn.Identity() if same
                             else ShortcutA(stride, out_channels - in_channels))

        def forward(self, x: Any) -> Any:
            out = F.relu(self.bn1(self.conv1(x)))
            return F.relu(self.bn2(self.conv2(out)) + self.shortcut(x))

    return ShortcutA, BasicBlock


def build_torch_resnet(blocks: int, in_channels: int, num_classes: int) -> Any:
    """The CIFAR ResNet of depth ``6 * blocks + 2`` (He et al. 2016, Sec. 4.2), as the zoo's.

    conv3x3(in -> 16, no bias) - BN - ReLU; three stages of ``blocks`` basic
    blocks with 16, 32 and 64 channels, the first block of stages 2 and 3 with
    stride 2 (28x28 inputs: planes 28, 14, 7; 32x32: 32, 16, 8); the shortcut
    is the identity where the shape is kept, else option A (parameter-free);
    global average pooling over the plane, then Linear(64 -> num_classes).
    BatchNorm: eps 1e-5, momentum 0.1 (PyTorch's convention: running =
    0.9 running + 0.1 batch), gamma 1, beta 0, running mean 0 and variance 1.
    Convolution and linear weights are Kaiming-uniform with bound
    ``sqrt(6 / fan_in)`` drawn from torch's generator (the suite's rule, not
    PyTorch's default ``1 / sqrt(fan_in)``), the linear bias 0.

    ``parameters()`` order (that of :func:`flat_params`) is module order: the
    stem conv's weight, its BN's gamma and beta, then per block conv1 weight,
    bn1 gamma, beta, conv2 weight, bn2 gamma, beta, and last the linear weight
    and bias.
    """
    import torch  # lazy: PyTorch is optional
    from torch import nn

    _, BasicBlock = _resnet_modules()
    width = RESNET_WIDTHS[0]
    layers: list[Any] = [nn.Conv2d(in_channels, width, 3, 1, 1, bias=False),
                         nn.BatchNorm2d(width, eps=1e-5, momentum=0.1), nn.ReLU()]
    for stage, out_channels in enumerate(RESNET_WIDTHS):
        for block in range(blocks):
            stride = 2 if stage > 0 and block == 0 else 1
            layers.append(BasicBlock(width, out_channels, stride))
            width = out_channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(width, num_classes)]
    model = nn.Sequential(*layers)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Conv2d, nn.Linear)):
                fan_in = module.weight[0].numel()
                bound = math.sqrt(6.0 / fan_in)
                module.weight.uniform_(-bound, bound)
                if module.bias is not None:
                    module.bias.zero_()
    return model


#: ``--compress`` values the peer has a DDP communication hook for on the CPU (PyTorch's
#: ``bf16_compress_hook`` needs CUDA and NCCL: on gloo it raises).
PEER_CODECS = ("none", "fp16", "powersgd")


def check_compress(spec: str, powersgd_start: int) -> str | None:
    """What is wrong with ``--compress``/``--powersgd-start`` for the peer (None if fine)."""
    name, _, arg = spec.partition(":")
    if name not in PEER_CODECS or (arg and name != "powersgd"):
        return (f"--compress {spec}: the PyTorch peer has hooks for "
                f"{', '.join(PEER_CODECS[1:])} (powersgd[:R]) only")
    if name == "powersgd":
        if arg and not (arg.isdigit() and int(arg) >= 1):
            return f"--compress {spec}: the rank must be an integer >= 1"
        if powersgd_start <= 1:
            return ("--powersgd-start must be > 1 for PyTorch's powerSGD_hook with error "
                    f"feedback and warm start, got {powersgd_start}")
    return None


def register_compress_hook(net: Any, spec: str, powersgd_start: int, seed: int) -> None:
    """Register PyTorch's DDP communication hook of ``spec`` on ``net``.

    ``fp16``: ``default_hooks.fp16_compress_hook`` (each bucket divided by the world size
    and allreduced in 16 bits); ``powersgd:R``:
    ``powerSGD_hook.powerSGD_hook`` with ``PowerSGDState(matrix_approximation_rank=R,
    start_powerSGD_iter=powersgd_start)`` and PyTorch's other defaults (min compression
    rate 2, error feedback and warm start on), as ``--compress powersgd:R`` of ours.
    """
    if spec == "none":
        return
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    name, _, arg = spec.partition(":")
    if name == "fp16":
        net.register_comm_hook(None, default_hooks.fp16_compress_hook)
    else:
        state = powerSGD_hook.PowerSGDState(
            process_group=None, matrix_approximation_rank=int(arg or 1),
            start_powerSGD_iter=powersgd_start, random_seed=seed)
        net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def _float_buffers(model: Any) -> list[Any]:
    """BatchNorm's running means and variances (not ``num_batches_tracked``)."""
    return [b for b in model.buffers() if b.is_floating_point()]


def make_step(args: argparse.Namespace, model: Any) -> tuple[Callable[[Any, Any], float],
                                                              Callable[[], None]]:
    """``(step(x, y) -> loss, finish())`` of the chosen peer around ``model``."""
    import torch  # lazy: PyTorch is optional
    import torch.distributed as dist
    from torch.nn import functional as F

    if args.algorithm == "ssgd":
        from torch.nn.parallel import DistributedDataParallel

        # per-rank BatchNorm statistics, as ours: no broadcast of rank 0's before each forward
        net = DistributedDataParallel(model, bucket_cap_mb=args.bucket_cap_mb,
                                      broadcast_buffers=False)
        register_compress_hook(net, args.compress, args.powersgd_start, args.seed)
    else:
        net = model
    buffers = _float_buffers(model)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum,
                          weight_decay=args.weight_decay)
    averager = None
    if args.algorithm == "localsgd":
        from torch.distributed.algorithms.model_averaging import (
            averagers,
            utils,
        )

        averager = averagers.PeriodicModelAverager(period=args.period,
                                                   warmup_steps=args.period - 1)

    def step(x: Any, y: Any) -> float:
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(net(x), y)
        loss.backward()
        opt.step()
        if averager is not None:
            # warmup_steps = period - 1: the averager averages at 0-based steps k*period - 1
            round_ends = (averager.step + 1) % args.period == 0
            averager.average_parameters(model.parameters())
            if round_ends and buffers:
                utils.average_parameters(iter(buffers), dist.group.WORLD)
        return float(loss.detach())

    def finish() -> None:
        """Average a last round shorter than the period (ours always ends averaged)."""
        if averager is not None and averager.step % args.period != 0:
            utils.average_parameters(iter(model.parameters()), dist.group.WORLD)
            if buffers:
                utils.average_parameters(iter(buffers), dist.group.WORLD)

    return step, finish


def evaluate(model: Any, x: np.ndarray, y: np.ndarray, batch: int = 2000) -> tuple[float, float]:
    """(mean loss, accuracy) of ``model`` on a split."""
    import torch  # lazy: PyTorch is optional
    from torch.nn import functional as F

    total, correct = 0.0, 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(y), batch):
            xb = torch.from_numpy(np.ascontiguousarray(x[start:start + batch]))
            yb = torch.from_numpy(np.ascontiguousarray(y[start:start + batch]))
            logits = model(xb)
            total += float(F.cross_entropy(logits, yb, reduction="sum"))
            correct += int((logits.argmax(dim=1) == yb).sum())
    model.train()
    return total / len(y), correct / len(y)


def train(args: argparse.Namespace) -> PeerResult | None:
    """Train on this rank; returns the result on rank 0 (None elsewhere).

    * the model: ``mlp`` (flatten, 784-256-128-10, ReLU), ``lenet`` (conv5 with
      padding 2 on 28x28 inputs, 2x2 max pool, conv5, pool, 120-84-classes), or
      ``resnet8`` / ``resnet20`` (a conv3x3-BN-ReLU stem, 3 stages of 1 or 3 basic
      blocks with 16, 32, 64 channels, option-A shortcuts, global average pooling,
      a linear head: :func:`build_torch_resnet`), in float32;
    * the data: :func:`syncbench.bench.data.catalog.load_dataset` and each rank's
      shard and batches from :class:`syncbench.bench.train.stream.BatchStream`
      (same seed), fetched inside the timed loop as our driver does;
    * the optimizer: ``torch.optim.SGD`` with momentum and L2 weight decay (the
      convention of :class:`syncbench.algorithms.optimizer.MomentumSGD`);
    * ``ssgd``: ``DistributedDataParallel`` averages the gradients (buckets of
      ``bucket_cap_mb``, allreduce overlapped with backward), every rank applies
      the same update (Goyal et al. 2017);
    * ``localsgd``: ``PeriodicModelAverager(period, warmup_steps=period - 1)``
      averages the parameters after every ``period``-th local step (the rounds of
      :class:`syncbench.algorithms.localsgd.LocalSGD`); a last, shorter round is
      averaged too, as ours does. Momentum buffers stay local in both.

    BatchNorm's buffers are never reduced as gradients: training normalises with
    each rank's own batch statistics (no SyncBatchNorm), DDP runs with
    ``broadcast_buffers=False`` (its default broadcasts rank 0's running
    statistics before every forward: a per-step collective the rule does not
    have), and Local SGD averages the running means and variances in the same
    rounds as the parameters (one more Allreduce after the averager's, which takes
    parameters with gradients only; ``num_batches_tracked`` is equal everywhere).
    Rank 0's running statistics are the ones evaluated.
    """
    import torch  # lazy: PyTorch is optional (syncbench[peers])
    import torch.distributed as dist

    rank, world = rank_and_size()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        raise SystemExit("torch_runner: set MASTER_PORT (the driver picks a free port)")
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world)
    try:
        data = load_dataset(args.dataset, args.data_dir,
                            synthetic_train=args.synthetic_samples, seed=args.seed)
        stream = BatchStream(data.train_x, data.train_y, rank, world, args.batch_size,
                             args.seed, dtype=np.float32)
        steps = max(1, int(args.epochs * stream.steps_per_epoch))
        torch.manual_seed(args.seed)  # the same initial model on every rank
        model = build_torch_model(args.model, data.input_shape, data.num_classes)
        model.train()  # BatchNorm normalises with the batch's statistics while training
        step, finish = make_step(args, model)
        losses = np.empty(steps)
        dist.barrier()
        start = time.perf_counter()
        for i in range(steps):
            xb, yb = stream.next()
            losses[i] = step(torch.from_numpy(xb), torch.from_numpy(yb))
        finish()
        elapsed = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        wall = float(elapsed[0])
        result = None
        if rank == 0:
            if args.save_model:
                save_params(model, args.save_model)
            test_loss, accuracy = evaluate(model, data.test_x, data.test_y)
            head = max(1, min(10, steps // 4))
            result = PeerResult(
                peer=PEERS[args.algorithm], algorithm=args.algorithm, model=args.model,
                world_size=world, steps=steps, batch_size=args.batch_size, wall_s=wall,
                samples_per_s=steps * args.batch_size * world / wall,
                first_loss=float(losses[:head].mean()), last_loss=float(losses[-head:].mean()),
                test_loss=test_loss, accuracy=accuracy, torch_version=torch.__version__,
                threads=args.threads, compress=args.compress)
        dist.barrier()  # tear gloo down together: a rank leaving early can abort the others
        return result
    finally:
        dist.destroy_process_group()


def step_throughput(model_name: str, batch: int, steps: int, threads: int = 1,
                    seed: int = 0) -> float:
    """Samples/s of ``steps`` single-process training steps on random inputs.

    The PyTorch counterpart of :func:`syncbench.bench.micro.speed.step_throughput`
    (same input shape, from its ``SHAPES``; 10 classes; momentum SGD; 3
    warm-up steps; no data loading, no communication; ``gpt``: the twin of
    :mod:`.torch_gpt` from our model's initial parameters, on the same token
    windows), with
    ``torch.set_num_threads(threads)``. The model is in training mode, so
    BatchNorm normalises with each batch's statistics and updates its running
    ones, as our training step does.
    """
    import torch  # lazy: PyTorch is optional (syncbench[peers])
    from torch.nn import functional as F

    torch.set_num_threads(threads)
    torch.manual_seed(seed)
    if parse_gpt_spec(model_name) is not None:  # the twin with our initial parameters
        ours, tokens, targets = timed_model(model_name, batch, "float32", seed)
        model = build_torch_gpt(ours.spec, VOCAB, ours.params)
        x, y = torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(
            targets.astype(np.int64))

        def loss() -> Any:
            return model.loss(x, y)
    else:
        shape = SHAPES.get(model_name, (1, 28, 28))
        model = build_torch_model(model_name, shape, 10)
        rng = np.random.default_rng(seed)
        x = torch.from_numpy(rng.random((batch, *shape)).astype(np.float32))
        y = torch.from_numpy(rng.integers(0, 10, batch))

        def loss() -> Any:
            return F.cross_entropy(model(x), y)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def one_step() -> None:
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()

    for _ in range(3):
        one_step()
    start = time.perf_counter()
    for _ in range(steps):
        one_step()
    return batch * steps / (time.perf_counter() - start)


def flat_params(model: Any) -> np.ndarray:
    """Every parameter of ``model`` in ``parameters()`` order, as one float32 vector.

    Module order, each tensor in PyTorch's layout: a Linear's weight then its
    bias, the weight of shape (out, in), the TRANSPOSE of the suite's (in, out)
    Linear weights; a Conv2d's weight (out, in, k, k), as the suite's, then its
    bias if it has one (the ResNets' convolutions have none); a BatchNorm's
    gamma then beta. BatchNorm's running statistics are buffers, not
    parameters, and are not included. For the ResNets the order is spelled out
    in :func:`build_torch_resnet`.
    """
    return np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])


def save_params(model: Any, path: str) -> None:
    """Write :func:`flat_params` to ``path`` (``.npy`` bytes, under that exact name),
    atomically (``write_atomic``; no BatchNorm buffers)."""
    buf = io.BytesIO()
    np.save(buf, flat_params(model))
    write_atomic(path, buf.getvalue())


def parse_result(stdout: str) -> dict[str, Any]:
    """The ``peer-result`` JSON of a run's standard output (``ValueError`` if absent)."""
    for line in stdout.splitlines():
        if line.startswith(RESULT_PREFIX):
            return json.loads(line[len(RESULT_PREFIX):])
    raise ValueError("no 'peer-result' line in the peer's output")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The runner's flags (names and defaults as in ``syncbench train``)."""
    parser.add_argument("--algorithm", choices=sorted(PEERS), default="ssgd",
                        help="ssgd (DistributedDataParallel) or localsgd "
                        "(PeriodicModelAverager)")
    parser.add_argument("--model", choices=MODELS, default="mlp",
                        help="the architecture (default mlp): " + ", ".join(MODELS))
    parser.add_argument("--dataset", choices=DATASETS, default="fashion-mnist")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--synthetic-samples", type=int, default=8192)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--batch-size", type=int, default=64, help="per-rank batch")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--weight-decay", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--period", type=int, default=4, help="localsgd: steps per averaging")
    parser.add_argument("--bucket-cap-mb", type=float, default=25.0,
                        help="ssgd: DDP gradient bucket size in MB (PyTorch's default 25)")
    parser.add_argument("--compress", default="none", metavar="NAME[:ARG]",
                        help="ssgd: DDP communication hook: none (default), fp16 or "
                        "powersgd[:R] (PyTorch's fp16_compress_hook, powerSGD_hook)")
    parser.add_argument("--powersgd-start", type=int, default=1000, metavar="STEPS",
                        help="ssgd --compress powersgd: start_powerSGD_iter (default 1000)")
    parser.add_argument("--save-model", default=None, metavar="PATH",
                        help="rank 0 writes the final parameters (flat float32 .npy) here")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch.set_num_threads per rank (default 1, as OMP_NUM_THREADS=1)")
    parser.add_argument("--out", default=None, metavar="PATH",
                        help="rank 0 also writes the peer-result JSON here")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m syncbench.bench.experiment.peers.torch_runner",
                                     description=__doc__.split("\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    if args.period < 1:
        parser.error(f"--period must be >= 1, got {args.period}")
    wrong = check_compress(args.compress, args.powersgd_start)
    if wrong is not None:
        parser.error(wrong)
    result = train(args)
    if result is not None:
        print(RESULT_PREFIX + json.dumps(asdict(result)), flush=True)
        if args.out:
            write_atomic(args.out, json.dumps(asdict(result)).encode())
        print(f"{result.peer} {result.model} np={result.world_size}: accuracy "
              f"{result.accuracy:.4f}  loss {result.test_loss:.4f}  "
              f"{result.samples_per_s:.1f} samples/s  wall {result.wall_s:.2f}s", flush=True)
    return 0


def exit_now(status: int) -> None:
    """Flush and leave without the interpreter's and C++'s teardown.

    Everything the run keeps is printed and written by now, and the process group is
    destroyed. Yet on a loaded host one of gloo's C++ threads can still be joinable
    when PyTorch's static objects are destroyed at exit: ``std::thread``'s destructor
    then calls ``std::terminate`` ("terminate called without an active exception") and
    the rank dies by SIGABRT after a run that succeeded (1 run in 25 here with three
    busy loops beside two ranks). PyTorch's own attempt to tear groups down at exit
    (pytorch/pytorch#179291) was abandoned, so the runner skips that teardown.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    exit_now(main())
