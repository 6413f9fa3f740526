"""The transformer's compute split (``bench/simulate/workload.py``: ``gpt_split``): its
FLOPs add up to a training step's, and its hook calls are the ones ``GPT.loss_and_grad``
makes, in its order, so SSGD's buckets become ready where they do."""

from __future__ import annotations

import math

import numpy as np
import pytest

from syncbench.bench.simulate import strategies
from syncbench.bench.simulate.workload import (
    build_zoo_model,
    from_profile,
    gpt_flops,
    gpt_split,
    model_split,
)
from syncbench.kernels.gpt import GPTSpec, flops_per_token

SPEC = "gpt:d=32,layers=3,heads=2,ctx=16"


def hand_count(spec: GPTSpec, vocab: int) -> int:
    """Forward FLOPs per token from the parameter shapes, 2 per multiply-add: each block's
    four weight matrices, attention's q k^T and probs v over the full (ctx, ctx) square,
    the tied output layer."""
    d = spec.d
    gemms = sum(a * b for a, b in ((d, 3 * d), (d, d), (d, 4 * d), (4 * d, d)))
    return spec.layers * (2 * gemms + 2 * 2 * spec.ctx * d) + 2 * d * vocab


@pytest.mark.parametrize("spec", [GPTSpec(), GPTSpec(d=32, layers=3, heads=2, ctx=16),
                                  GPTSpec(d=768, layers=12, heads=12, ctx=1024)])
def test_split_flops_sum_to_three_forwards_of_the_model(spec):
    """A step is forward, the head's loss and gradients, backward: 3x the forward that
    ``flops_per_token`` counts (and a hand count of the shapes gives), per token."""
    vocab = 256
    forward, backward, head = gpt_flops(spec, vocab)
    per_token = sum(forward) + head + sum(backward)
    assert per_token == 3 * flops_per_token(spec, vocab)["forward"] == 3 * hand_count(spec, vocab)
    batch = 4
    assert per_token * spec.ctx * batch == 3 * hand_count(spec, vocab) * spec.ctx * batch


def test_hooks_are_the_ones_loss_and_grad_calls_in_its_order():
    model = build_zoo_model(SPEC, "shakespeare")
    split = model_split(model)
    polls, ready = [], []
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (2, model.spec.ctx))
    model.loss_and_grad(x, x, on_grads_ready=ready.append, poll=lambda: polls.append(1))
    assert len(split.forward) == len(polls) == model.spec.layers + 1
    assert list(split.offsets) == ready == list(model.layer_offsets[::-1])
    shares = split.hooks
    assert np.all(np.diff(shares) >= 0) and shares[-1] == 1.0
    # backward starts after the forward and the head; the embedding's gradient (offset
    # 0, where the tied head's part went first) is final only at the very end
    assert split.backward[0] > split.forward[-1]
    assert split.backward[-1] == 1.0 and split.offsets[-1] == 0


def test_the_embeddings_bucket_is_posted_by_the_last_hook():
    model = build_zoo_model(SPEC, "shakespeare")
    split = gpt_split(model.spec, model.vocab)
    plan = [(int(o), int(e)) for o, e in zip(model.layer_offsets,
                                             [*model.layer_offsets[1:], model.size])][::-1]
    hooks = strategies.hook_plan(plan, split.offsets)
    assert hooks.posts[0] == (0,) and hooks.posts[-1] == (len(plan) - 1,)


def test_gpt2_small_profile_splits_by_blocks_and_holds_its_parameters():
    w = from_profile("gpt2-small", "h100")
    split = w.compute_split()
    assert sum(math.prod(s) for s in w.tensor_shapes) == w.params == 124439808
    assert len(split.backward) == len(w.layer_offsets) == 14  # embedding, 12 blocks, norm
    assert "FLOPs per block" in split.source
