"""The codecs against PyTorch, the reference peer: bf16/fp16 casts bit for bit and
PowerSGD's orthogonalization and products against ``powerSGD_hook``'s own functions.

Skipped when PyTorch is not installed (the CPU wheel: ``pip install torch``).
Tolerances: float32 products of length k agree to k 2**-24 relative in the worst
case; the bounds below are looser than that by a small factor and far tighter
than any disagreement in the algorithm would give.
"""

from __future__ import annotations

import numpy as np
import pytest

from syncbench.algorithms.codecs import (
    BFloat16Codec,
    Float16Codec,
    PowerSGD,
    compute_p,
    compute_q,
    decompress,
    orthogonalize,
)

torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
hook = pytest.importorskip("torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook",
                           reason="this PyTorch has no distributed PowerSGD hook")


def edge_and_random_floats() -> np.ndarray:
    """Random bit patterns plus ties, subnormals, overflow, infinities, zeros and NaNs."""
    rng = np.random.default_rng(0)
    words = [rng.integers(0, 2**32, 100_000, dtype=np.uint64).astype(np.uint32)]
    high = rng.integers(0, 2**16, 2000, dtype=np.uint32) << 16
    words += [high | 0x8000, high | 0x18000, high | 0x7FFF, high | 0x8001]  # ties and near
    words.append(np.array([0, 0x80000000, 1, 0x80000001, 0x7FFFFF, 0x8000, 0x18000,
                           0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F800000, 0xFF800000,
                           0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFFFFFFF], dtype=np.uint32))
    return np.concatenate(words).view(np.float32)


def torch_codes(x: np.ndarray, dtype) -> np.ndarray:
    return torch.from_numpy(x).to(dtype).view(torch.int16).numpy().view(np.uint16)


@pytest.mark.parametrize("codec, dtype", [(BFloat16Codec(), "bfloat16"),
                                          (Float16Codec(), "float16")], ids=["bf16", "fp16"])
def test_16_bit_codes_equal_pytorchs_cast_bit_for_bit(codec, dtype):
    """Every non-NaN value gives PyTorch's code; NaN gives a NaN in both (the NaN code
    itself is the CPU kernel's choice: 0xFFFF for bf16 on AVX2, where ours is the same)."""
    x = edge_and_random_floats()
    ours = codec.encode(x)
    theirs = torch_codes(x, getattr(torch, dtype))
    nan = np.isnan(x)
    np.testing.assert_array_equal(ours[~nan], theirs[~nan])
    assert np.isnan(codec.decode(ours[nan])).all()
    assert torch.from_numpy(theirs[nan].view(np.int16)).view(getattr(torch, dtype)).isnan().all()
    np.testing.assert_array_equal(codec.decode(ours[~nan]),
                                  torch.from_numpy(theirs[~nan].view(np.int16))
                                  .view(getattr(torch, dtype)).float().numpy())


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_orthogonalize_equals_pytorchs(rank):
    """Gram-Schmidt for ranks 1 and 2, Householder QR above, as ``_orthogonalize`` picks;
    agreement to 1e-5 (float32 norms and dot products of 300 terms, or two LAPACKs)."""
    rng = np.random.default_rng(rank)
    p = rng.standard_normal((300, rank)).astype(np.float32)
    theirs = torch.from_numpy(p.copy()).unsqueeze(0)
    hook._orthogonalize(theirs, 0)
    ours = p.copy()
    orthogonalize(ours)
    np.testing.assert_allclose(ours, theirs[0].numpy(), rtol=0, atol=1e-5)
    with_eps = torch.from_numpy(p[:, :1].copy()).unsqueeze(0)
    hook._orthogonalize(with_eps, 1e-3)
    ours = p[:, :1].copy()
    orthogonalize(ours, epsilon=1e-3)
    np.testing.assert_allclose(ours, with_eps[0].numpy(), rtol=0, atol=1e-6)


@pytest.mark.parametrize("rank", [1, 2, 4])
def test_powersgd_products_of_one_matrix_equal_pytorchs_from_the_same_q(rank):
    """The hook's sequence on one matrix and one rank: orthogonalize Q, P = M Q,
    orthogonalize P, Q = M^T P, M' = P Q^T, E = M - M'; P, Q and M' to 1e-5 of their
    largest magnitude (float32 GEMMs over 64 and 96 terms in different BLAS)."""
    rng = np.random.default_rng(10 + rank)
    m = rng.standard_normal((64, 96)).astype(np.float32)
    q0 = rng.standard_normal((96, rank)).astype(np.float32)

    tm = torch.from_numpy(m).unsqueeze(0)
    tq = torch.from_numpy(q0.copy()).unsqueeze(0)
    hook._orthogonalize(tq, 0)
    tp = torch.bmm(tm, tq)
    hook._orthogonalize(tp, 0)
    tq = torch.bmm(tm.transpose(1, 2), tp)
    tapprox = torch.bmm(tp, tq.transpose(1, 2))

    q = q0.copy()
    orthogonalize(q)
    p = compute_p(m, q)
    orthogonalize(p)
    q = compute_q(m, p)
    approx = decompress(p, q)
    for ours, theirs in ((p, tp), (q, tq), (approx, tapprox)):
        theirs = theirs[0].numpy()
        np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5 * np.abs(theirs).max())

    # the same through the state, world size 1, with PyTorch's Q injected
    state = PowerSGD(rank=rank, start_iter=0).state([m.shape])
    state.qs = [q0.copy()]
    flat = state.prepare(m.reshape(-1))
    p_sum = state.p_buffer(flat)
    q_sum = state.q_buffer(flat, p_sum)
    out = state.finish(flat, q_sum, state.uncompressed_buffer(flat), 1)
    theirs = tapprox[0].numpy()
    np.testing.assert_allclose(out.reshape(m.shape), theirs, rtol=0,
                               atol=1e-5 * np.abs(theirs).max())
    np.testing.assert_allclose(state.error.reshape(m.shape), m - theirs, rtol=0,
                               atol=1e-5 * np.abs(theirs).max())


def test_should_compress_equals_pytorchs():
    for rows, cols, rank, rate in [(784, 128, 1, 2), (128, 1, 1, 2), (3, 3, 2, 0.5),
                                   (10, 2, 2, 2), (8, 27, 4, 2), (100, 1, 1, 0.5)]:
        r = min(rows, cols, rank)
        expect = hook._should_compress(rows, cols, r, rate)[0]
        layout = PowerSGD(rank=rank, min_compression_rate=rate).layout([(rows, cols)])
        assert layout.slots[0].compressed == expect, (rows, cols, rank, rate)
