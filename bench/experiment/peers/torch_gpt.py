"""The PyTorch twin of ``gpt`` (:mod:`syncbench.kernels.gpt`), parameter for parameter.

Built from PyTorch's own operations (``F.layer_norm``,
``F.scaled_dot_product_attention`` with ``is_causal=True``,
``F.gelu(approximate="tanh")``, ``F.cross_entropy``), not from ours, so that
equal losses from equal parameters check our hand-written forward and
backward. Its ``parameters()`` come in our flat-buffer order with our shapes
(weights (in, out), applied as ``x @ W + b``), so :func:`load_flat` and
:func:`flat_grads` copy between the two with one ``torch.cat``; its
initialisation is ours too (:func:`build_torch_gpt` copies a :class:`GPT`'s
parameters when one is given).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from syncbench.kernels.gpt import Block, GPTSpec


@functools.cache
def _classes() -> tuple[type, type]:
    """``(TorchBlock, TorchGPT)``, defined on first use (torch is imported lazily)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    def empty(*shape: int) -> Any:
        return nn.Parameter(torch.empty(*shape, dtype=torch.get_default_dtype()))

    class TorchBlock(nn.Module):
        """A pre-LayerNorm block; parameters registered in :attr:`Block.NAMES` order."""

        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            shapes = (
                (d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,),
                (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,))
            for name, shape in zip(Block.NAMES, shapes):
                self.register_parameter(name, empty(*shape))

        def forward(self, h: Any) -> Any:
            b, t, d = h.shape
            a = F.layer_norm(h, (d,), self.ln1_g, self.ln1_b, 1e-5)
            q, k, v = (a @ self.w_qkv + self.b_qkv).split(d, dim=-1)
            q, k, v = (x.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                       for x in (q, k, v))
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            h = h + att.transpose(1, 2).reshape(b, t, d) @ self.w_proj + self.b_proj
            m = F.layer_norm(h, (d,), self.ln2_g, self.ln2_b, 1e-5)
            g = F.gelu(m @ self.w_fc + self.b_fc, approximate="tanh")
            return h + g @ self.w_out + self.b_out

    class TorchGPT(nn.Module):
        """Embedding (``wte``, ``wpe``), blocks, final LayerNorm, logits ``h @ wte^T``."""

        def __init__(self, spec: GPTSpec, vocab: int) -> None:
            super().__init__()
            self.d = spec.d
            self.wte = empty(vocab, spec.d)
            self.wpe = empty(spec.ctx, spec.d)
            self.blocks = nn.ModuleList(TorchBlock(spec.d, spec.heads)
                                        for _ in range(spec.layers))
            self.lnf = nn.ParameterList([empty(spec.d), empty(spec.d)])

        def forward(self, tokens: Any) -> Any:
            h = self.wte[tokens] + self.wpe[: tokens.shape[1]]
            for block in self.blocks:
                h = block(h)
            h = F.layer_norm(h, (self.d,), self.lnf[0], self.lnf[1], 1e-5)
            return h @ self.wte.T

        def loss(self, tokens: Any, targets: Any) -> Any:
            """Mean next-token cross-entropy, nats per token."""
            logits = self(tokens)
            return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    return TorchBlock, TorchGPT


def build_torch_gpt(spec: GPTSpec, vocab: int, flat: np.ndarray | None = None) -> Any:
    """The twin of ``gpt`` of size ``spec``; with ``flat`` (a :class:`GPT`'s ``params``)
    its parameters are those values, else PyTorch's uninitialised memory is zeroed."""
    model = _classes()[1](spec, vocab)
    if flat is None:
        flat = np.zeros(sum(p.numel() for p in model.parameters()))
    load_flat(model, flat)
    return model


def load_flat(model: Any, flat: np.ndarray) -> None:
    """Copy a flat vector in our order into the twin's parameters."""
    import torch

    total = sum(p.numel() for p in model.parameters())
    if flat.size != total:
        raise ValueError(f"{flat.size} values for a twin of {total} parameters")
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.from_numpy(np.asarray(flat[offset : offset + p.numel()]))
                    .view(p.shape))
            offset += p.numel()


def flat_grads(model: Any) -> np.ndarray:
    """The twin's gradients as one flat vector in our order."""
    import torch

    return torch.cat([p.grad.reshape(-1) for p in model.parameters()]).numpy()
