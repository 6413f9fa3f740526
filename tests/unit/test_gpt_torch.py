"""``gpt`` against its PyTorch twin in float64: the same parameters in the same order, the
same gradients, and the same losses over 10 momentum-SGD steps on the committed excerpt.

Skipped when PyTorch is not installed (``pip install 'syncbench[peers]'``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed: pip install 'syncbench[peers]' (torch==2.13.0)")

from syncbench.bench.data.text import corpus  # noqa: E402
from syncbench.bench.experiment.peers.torch_gpt import (  # noqa: E402
    build_torch_gpt,
    flat_grads,
)
from syncbench.bench.train.stream import BatchStream  # noqa: E402
from syncbench.kernels import ops  # noqa: E402
from syncbench.kernels.gpt import GPT, GPTSpec  # noqa: E402

SAMPLE = (Path(__file__).parents[1] / "data" / "tempest_opening.txt").read_bytes()
SPEC = GPTSpec(d=32, layers=2, heads=4, ctx=16)
LR, MOMENTUM, STEPS = 0.1, 0.9, 10


@pytest.fixture(autouse=True)
def float64_torch():
    old, threads = torch.get_default_dtype(), torch.get_num_threads()
    torch.set_default_dtype(torch.float64)
    torch.set_num_threads(1)
    yield
    torch.set_default_dtype(old)
    torch.set_num_threads(threads)


def batches(count):
    ds = corpus({"a": SAMPLE[:5000], "b": SAMPLE[5000:]}, ("b",), "sample", "committed",
                ctx=SPEC.ctx)
    stream = BatchStream(ds.train_x, ds.train_y, 0, 1, 4, seed=1, dtype=np.float64)
    return [stream.next() for _ in range(count)]


def test_twin_parameters_are_ours_in_our_order():
    ours = GPT(SPEC, 256, dtype=np.float64, seed=2)
    twin = build_torch_gpt(SPEC, 256, ours.params)
    shapes = [s for layer in ours.layers for s in layer.param_shapes()]
    assert [tuple(p.shape) for p in twin.parameters()] == shapes
    flat = torch.cat([p.detach().reshape(-1) for p in twin.parameters()]).numpy()
    np.testing.assert_array_equal(flat, ours.params)


def test_same_gradient_from_the_same_parameters():
    ours = GPT(SPEC, 256, dtype=np.float64, seed=3)
    twin = build_torch_gpt(SPEC, 256, ours.params)
    (x, y), = batches(1)
    loss = ours.loss_and_grad(x, y)
    theirs = twin.loss(torch.from_numpy(x).long(), torch.from_numpy(y).long())
    theirs.backward()
    assert abs(loss - theirs.item()) < 1e-12
    np.testing.assert_allclose(ours.grads, flat_grads(twin), rtol=1e-9, atol=1e-13)


def test_ten_sgd_steps_give_the_same_losses_within_1e_9():
    ours = GPT(SPEC, 256, dtype=np.float64, seed=4)
    twin = build_torch_gpt(SPEC, 256, ours.params)
    opt = torch.optim.SGD(twin.parameters(), lr=LR, momentum=MOMENTUM)
    velocity, scratch = np.zeros_like(ours.params), np.zeros_like(ours.params)
    mine, theirs = [], []
    for x, y in batches(STEPS):
        mine.append(ours.loss_and_grad(x, y))
        ops.sgd_momentum_(ours.params, ours.grads, velocity, LR, MOMENTUM, 0.0, scratch)
        opt.zero_grad()
        loss = twin.loss(torch.from_numpy(x).long(), torch.from_numpy(y).long())
        loss.backward()
        opt.step()
        theirs.append(loss.item())
    assert mine[-1] < mine[0] - 0.5  # it learns
    np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-9)
