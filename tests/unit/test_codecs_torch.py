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


class Bucket:
    """The part of DDP's ``GradBucket`` the PowerSGD hook reads: one flat buffer, its
    per-parameter views, index 0, the last bucket of the step."""

    def __init__(self, flat: np.ndarray, shapes: list[tuple[int, ...]]) -> None:
        self.flat = torch.from_numpy(flat.copy())
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


@pytest.fixture(scope="module")
def gloo_world_of_one():
    dist = torch.distributed
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("this PyTorch has no gloo backend")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def pytorch_initial_qs(seed: int, shapes: list[tuple[int, int]], rank: int) -> list[np.ndarray]:
    """The hook's first Qs: ``manual_seed(RandomState(seed).randint(1e9))``, then one
    ``randn(1, cols, r)`` per compressed tensor (distinct shapes: in tensor order)."""
    draw = np.random.RandomState(seed).randint(1_000_000_000)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(draw)
        return [torch.randn(1, cols, min(rows, cols, rank))[0].numpy().copy()
                for rows, cols in shapes]


def test_powersgd_follows_pytorchs_hook_step_for_step(gloo_world_of_one):
    """The real ``powerSGD_hook`` (gloo, one rank) and our state fed the same gradients
    for two plain and five compressed steps, with PyTorch's first Q: result, P, Q and
    the error agree to 1e-5 of their largest magnitude at every step (float32 GEMMs in
    different BLAS; warm start carries the differences, error feedback does not grow
    them beyond that here)."""
    shapes = [(20, 10), (10,), (6, 2, 3, 3), (6,), (4, 4)]
    rank, start = 2, 2
    theirs = hook.PowerSGDState(process_group=None, matrix_approximation_rank=rank,
                                start_powerSGD_iter=start, random_seed=0)
    ours = PowerSGD(rank=rank, start_iter=start, seed=0).state(shapes)
    compressed = [(s.rows, s.cols) for s in ours.layout.compressed]
    assert compressed == [(20, 10), (6, 18)]
    rng = np.random.default_rng(20)

    def close(a, b):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-5 * max(np.abs(b).max(), 1e-30))

    for step in range(start + 5):
        grad = rng.standard_normal(ours.layout.size).astype(np.float32)
        result = hook.powerSGD_hook(theirs, Bucket(grad, shapes)).wait().numpy()
        if not ours.compressing:
            ours.finish_plain()
            np.testing.assert_array_equal(result, grad)  # one rank: the mean is the gradient
            continue
        if step == start:
            ours.qs = pytorch_initial_qs(0, compressed, rank)
        m = ours.prepare(grad)
        p_sum = ours.p_buffer(m)
        q_sum = ours.q_buffer(m, p_sum)
        ps = np.concatenate([p.reshape(-1) for p in ours.ps])
        out = ours.finish(m, q_sum, ours.uncompressed_buffer(m), 1)
        close(out, result)
        close(ps, theirs.p_memory_dict[0].numpy())
        close(np.concatenate([q.reshape(-1) for q in ours.qs]), theirs.q_memory_dict[0].numpy())
        close(ours.error, theirs.error_dict[0].numpy())
    assert ours.step == theirs.iter == start + 5
