"""``powersgd:R``: rank-R PowerSGD (Vogels, Karimireddy, Jaggi, NeurIPS 2019, arXiv 1905.13727).

The math is that of PyTorch's ``powerSGD_hook``
(``torch/distributed/algorithms/ddp_comm_hooks/powerSGD_hook.py``, read at
PyTorch 2.13), step by step, for one rank; the two Allreduces between the
steps are the reducer's. For every tensor of the gradient (the layers'
parameter arrays in flat-buffer order, :func:`tensor_shapes`):

1. The tensor is viewed as a matrix ``shape[0] x prod(shape[1:])``
   (``tensor.view(tensor.shape[0], -1)``: a convolution's ``out x in*k*k``;
   a vector of ``n`` is ``n x 1``) and its rank is ``r = min(rows, cols, R)``.
2. It is compressed only if ``(rows + cols) * r * min_compression_rate <
   rows * cols`` (PyTorch's ``_should_compress``). With a rate of at least 1
   no vector qualifies (``(n + 1) r >= n``), so biases and normalisation
   scales always go uncompressed; with a rate below 1 a long vector would be
   compressed, as in PyTorch. Uncompressed tensors are averaged by one plain
   Allreduce of their packed values (:meth:`PowerSGDState.uncompressed_buffer`).
3. ``M = G + E`` (error feedback, :meth:`PowerSGDState.prepare`).
4. ``Q`` is warm-started from the last step (or drawn from N(0, 1) the first
   time, and at every step without warm start); it is orthogonalized, then
   ``P = M Q`` (:meth:`PowerSGDState.p_buffer`). The reducer sums ``P`` over
   ranks (not divided: it is orthogonalized next).
5. ``P`` is orthogonalized and ``Q = M^T P`` (:meth:`PowerSGDState.q_buffer`).
   The reducer sums ``Q`` over ranks.
6. ``Q`` is divided by the world size, the tensor becomes ``P Q^T`` (the
   mean of the ranks' ``P P^T M``), uncompressed tensors their mean, and the
   error is ``E = M - result`` over the whole vector, uncompressed tensors
   included (PyTorch's ``input_tensor_cp - input_tensor``: for an
   uncompressed tensor the rank's value less the mean) (:meth:`PowerSGDState.finish`).

``start_iter`` (PyTorch's ``start_powerSGD_iter``): calls ``0 .. start_iter - 1``
are plain allreduces (:meth:`PowerSGDState.finish_plain`), the error starts at
zero on the first compressed call. PyTorch refuses ``start_powerSGD_iter <= 1``
with error feedback or warm start, because DDP rebuilds its buckets after the
first iteration; there are no buckets to rebuild here, so any ``start_iter >= 0``
is accepted.

Orthogonalization (:func:`orthogonalize`) follows PyTorch's ``_orthogonalize``:
Gram-Schmidt on the columns (``col /= norm(col) + epsilon``, then the column's
projection is removed from the rest) for ranks 1 and 2, Householder QR (LAPACK,
``numpy.linalg.qr``; PyTorch calls ``torch.linalg.qr``) above. ``epsilon`` is
PyTorch's ``orthogonalization_epsilon``, 0 by default (older PyTorch had 1e-8).

Where this differs from PyTorch:

- A column of zeros with ``epsilon == 0``: PyTorch divides by zero and the
  column (and so the layer) becomes NaN; here the column is left at zero (what
  PyTorch's recovery branch means to do).
- Initial ``Q``: PyTorch seeds its generator from ``RandomState(seed).randint(
  1_000_000_000)`` and draws ``torch.randn``; the seed sequence is the same
  here but the normal draws are NumPy's (``default_rng(that seed)``), so to
  compare with PyTorch step for step, set :attr:`PowerSGDState.qs` to PyTorch's
  initial ``Q`` before the first compressed call.
- The matrix of a tensor is its array's ``shape[0] x rest``. syncbench's
  dense layer stores its weight ``in x out``, PyTorch's ``Linear`` ``out x in``,
  so for a dense layer the two factorize transposed matrices (``P`` and ``Q``
  swap roles); feed PyTorch the transposed weight gradient to compare.
- PyTorch groups same-shaped tensors in its ``P``/``Q`` buffers
  (``shape_to_tensors``); here they are packed in tensor order. The Allreduce
  is elementwise, so only the layout of the buffer differs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

Shape = tuple[int, ...]
#: PyTorch's defaults (``PowerSGDState``), as ALGORITHMS.md asks.
DEFAULT_RANK = 1
DEFAULT_START_ITER = 1000
DEFAULT_MIN_COMPRESSION_RATE = 2.0
#: Seeds of the initial Q are drawn below this bound, as PyTorch draws them.
SEED_BOUND = 1_000_000_000
ITEMSIZE = 4  # float32 on the wire


def orthogonalize(matrix: np.ndarray, epsilon: float = 0.0, method: str = "auto") -> None:
    """Make the columns of ``matrix`` (rows x r, r <= rows) orthonormal, in place.

    ``method``: ``"gram-schmidt"`` (PyTorch's ``_orthogonalize_gram_schmidt``),
    ``"qr"`` (Householder, ``numpy.linalg.qr``) or ``"auto"``: Gram-Schmidt
    for r <= 2, QR above, as PyTorch's ``_orthogonalize`` chooses for float32.
    """
    if matrix.ndim != 2 or matrix.shape[1] > matrix.shape[0]:
        raise ValueError(f"orthogonalize needs rows >= columns, got {matrix.shape}")
    if method == "auto":
        method = "gram-schmidt" if matrix.shape[1] <= 2 else "qr"
    if method == "qr":
        matrix[...] = np.linalg.qr(matrix, mode="reduced")[0]
        return
    if method != "gram-schmidt":
        raise ValueError(f"orthogonalize method {method!r}: choose auto, gram-schmidt or qr")
    cols = matrix.shape[1]
    for i in range(cols):
        col = matrix[:, i:i + 1]
        norm = np.linalg.norm(col) + matrix.dtype.type(epsilon)
        if norm == 0:
            col[...] = 0  # PyTorch: NaN (division by zero); see the module docstring
        else:
            col /= norm
        if i + 1 < cols:
            rest = matrix[:, i + 1:]
            rest -= np.sum(col * rest, axis=0, keepdims=True) * col


def compute_p(m: np.ndarray, q: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``P = M Q`` (rows x r)."""
    return np.matmul(m, q, out=out)


def compute_q(m: np.ndarray, p: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``Q = M^T P`` (cols x r)."""
    return np.matmul(m.T, p, out=out)


def decompress(p: np.ndarray, q: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The rank-r approximation ``P Q^T`` (rows x cols)."""
    return np.matmul(p, q.T, out=out)


def should_compress(rows: int, cols: int, rank: int, min_compression_rate: float) -> bool:
    """PyTorch's ``_should_compress``: ``(rows + cols) rank min_rate < rows cols``."""
    return (rows + cols) * rank * min_compression_rate < rows * cols


def tensor_shapes(layer_shapes: Sequence[Sequence[Sequence[int]]],
                  layer_offsets: Sequence[int] | None = None) -> list[Shape]:
    """Every parameter array's shape in flat-buffer order, from each layer's ``param_shapes()``.

    ``layer_offsets`` (the model's ``layer_offsets``), when given, must be
    where each layer's arrays start in the flat buffer; a mismatch is a
    ValueError (the layout would be read wrongly).
    """
    shapes: list[Shape] = []
    offset = 0
    for index, arrays in enumerate(layer_shapes):
        if layer_offsets is not None and layer_offsets[index] != offset:
            raise ValueError(f"layer {index} starts at {layer_offsets[index]}, "
                             f"its shapes put it at {offset}")
        for shape in arrays:
            shapes.append(tuple(int(d) for d in shape))
            offset += math.prod(shape)
    return shapes


@dataclass(frozen=True)
class MatrixSlot:
    """One tensor of the flat gradient: where it is and how PowerSGD treats it."""

    offset: int
    shape: Shape
    rows: int
    cols: int
    #: ``min(rows, cols, R)``.
    rank: int
    compressed: bool

    @property
    def size(self) -> int:
        return self.rows * self.cols


@dataclass(frozen=True)
class Layout:
    """The tensors of one gradient vector, split into compressed and uncompressed."""

    slots: tuple[MatrixSlot, ...]
    size: int
    compressed: tuple[MatrixSlot, ...] = field(init=False)
    #: Flat indices of every uncompressed element, in order.
    uncompressed_index: np.ndarray = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "compressed", tuple(s for s in self.slots if s.compressed))
        parts = [np.arange(s.offset, s.offset + s.size) for s in self.slots if not s.compressed]
        index = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        object.__setattr__(self, "uncompressed_index", index)

    @property
    def p_size(self) -> int:
        """Elements of the packed P buffer (sum of rows x r)."""
        return sum(s.rows * s.rank for s in self.compressed)

    @property
    def q_size(self) -> int:
        """Elements of the packed Q buffer (sum of cols x r)."""
        return sum(s.cols * s.rank for s in self.compressed)

    @property
    def uncompressed_size(self) -> int:
        return int(self.uncompressed_index.size)


def build_layout(shapes: Sequence[Sequence[int]], rank: int,
                 min_compression_rate: float) -> Layout:
    """The :class:`Layout` of tensors of ``shapes`` laid one after another."""
    slots = []
    offset = 0
    for shape in shapes:
        shape = tuple(int(d) for d in shape)
        size = math.prod(shape)
        rows = shape[0] if shape else 1
        cols = size // rows if rows else 0
        r = min(rows, cols, rank)
        compress = size > 0 and should_compress(rows, cols, r, min_compression_rate)
        slots.append(MatrixSlot(offset, shape, rows, cols, r, compress))
        offset += size
    return Layout(tuple(slots), offset)


class PowerSGD:
    """``powersgd:R``: the options; :meth:`state` binds them to a gradient's tensors."""

    name = "powersgd"

    def __init__(self, rank: int = DEFAULT_RANK, start_iter: int = DEFAULT_START_ITER,
                 min_compression_rate: float = DEFAULT_MIN_COMPRESSION_RATE,
                 error_feedback: bool = True, warm_start: bool = True,
                 epsilon: float = 0.0, seed: int = 0) -> None:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)):
            raise ValueError(f"powersgd rank {rank!r} is not an integer: "
                             "give a rank >= 1 (e.g. powersgd:2)")
        if rank < 1:
            raise ValueError(f"powersgd rank {rank} is below 1: give a rank >= 1 (e.g. powersgd:2)")
        if isinstance(start_iter, bool) or not isinstance(start_iter, (int, np.integer)) \
                or start_iter < 0:
            raise ValueError(f"powersgd start_iter {start_iter!r} is not an integer >= 0")
        if not min_compression_rate > 0 or math.isinf(min_compression_rate):
            raise ValueError(f"powersgd min_compression_rate {min_compression_rate!r} "
                             "is not a finite number > 0")
        if not epsilon >= 0 or math.isinf(epsilon):
            raise ValueError(f"powersgd epsilon {epsilon!r} is not a finite number >= 0")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) \
                or not 0 <= seed < 2**32:
            raise ValueError(f"powersgd seed {seed!r} is not an integer in [0, 2**32)")
        self.rank = int(rank)
        self.start_iter = int(start_iter)
        self.min_compression_rate = float(min_compression_rate)
        self.error_feedback = bool(error_feedback)
        self.warm_start = bool(warm_start)
        self.epsilon = float(epsilon)
        self.seed = int(seed)
        self.spec = f"{self.name}:{self.rank}"

    def layout(self, shapes: Sequence[Sequence[int]]) -> Layout:
        """Which of the tensors of ``shapes`` (flat-buffer order) are compressed."""
        return build_layout(shapes, self.rank, self.min_compression_rate)

    def wire_bytes(self, count: int, shapes: Sequence[Sequence[int]]) -> int:
        """Bytes one rank hands to MPI per compressed call: ``P``, ``Q`` and the uncompressed.

        ``count`` must be the elements of ``shapes`` together. A plain call
        (before ``start_iter``) hands ``4 count`` bytes.
        """
        layout = self.layout(shapes)
        if layout.size != count:
            raise ValueError(f"powersgd: shapes hold {layout.size} elements, not {count}")
        return ITEMSIZE * (layout.p_size + layout.q_size + layout.uncompressed_size)

    def state(self, shapes: Sequence[Sequence[int]]) -> PowerSGDState:
        """A fresh state (step 0, zero error, no ``Q`` yet) for a gradient of ``shapes``."""
        return PowerSGDState(self, self.layout(shapes))


class PowerSGDState:
    """One rank's PowerSGD state: the step, the error, the warm-started ``Q`` of each tensor.

    A compressed call, with the reducer's two sums between the steps::

        m = state.prepare(grad)
        p_sum = allreduce_sum(state.p_buffer(m))      # with the uncompressed one
        u_sum = allreduce_sum(state.uncompressed_buffer(m))
        q_sum = allreduce_sum(state.q_buffer(m, p_sum))
        mean = state.finish(m, q_sum, u_sum, world_size)

    and before ``start_iter`` the reducer allreduces ``grad`` itself and calls
    :meth:`finish_plain`.
    """

    def __init__(self, options: PowerSGD, layout: Layout) -> None:
        self.options = options
        self.layout = layout
        #: Calls so far, plain and compressed (PyTorch's ``state.iter``).
        self.step = 0
        #: ``M - result`` of the last compressed call (float32), or None without error feedback.
        self.error: np.ndarray | None = (
            np.zeros(layout.size, dtype=np.float32) if options.error_feedback else None)
        #: ``Q`` of each compressed tensor (cols x r), kept between calls with warm start.
        self.qs: list[np.ndarray] | None = None
        self.rng = np.random.RandomState(options.seed)
        #: The orthogonalized ``P`` of each compressed tensor, from :meth:`q_buffer` to
        #: :meth:`finish` of the same call (empty otherwise).
        self.ps: list[np.ndarray] = []

    @property
    def compressing(self) -> bool:
        """Whether this call is compressed (``step >= start_iter``)."""
        return self.step >= self.options.start_iter

    def wire_bytes(self, count: int) -> int:
        """Bytes this rank hands to MPI in this call: plain (4 per element) or compressed."""
        if count != self.layout.size:
            raise ValueError(f"powersgd: state holds {self.layout.size} elements, not {count}")
        if not self.compressing:
            return ITEMSIZE * count
        lay = self.layout
        return ITEMSIZE * (lay.p_size + lay.q_size + lay.uncompressed_size)

    def matrix(self, flat: np.ndarray, slot: MatrixSlot) -> np.ndarray:
        """The rows x cols view of ``slot`` in flat vector ``flat``."""
        return flat[slot.offset:slot.offset + slot.size].reshape(slot.rows, slot.cols)

    def prepare(self, grad: np.ndarray) -> np.ndarray:
        """``M = grad + error`` (a new float32 vector; ``grad`` is left alone)."""
        if grad.shape != (self.layout.size,) or grad.dtype != np.float32:
            raise ValueError(f"powersgd expects a float32 vector of {self.layout.size}, "
                             f"got {grad.dtype} {grad.shape}")
        if not self.compressing:
            raise ValueError(f"powersgd call {self.step} is plain (start_iter "
                             f"{self.options.start_iter}): allreduce and call finish_plain")
        if self.error is None:
            return grad.copy()
        return grad + self.error

    def _initial_qs(self) -> list[np.ndarray]:
        """Fresh ``Q``s from N(0, 1), seeded as PyTorch seeds them (the same on every rank)."""
        gen = np.random.default_rng(self.rng.randint(SEED_BOUND))
        return [gen.standard_normal((s.cols, s.rank), dtype=np.float32)
                for s in self.layout.compressed]

    def p_buffer(self, m: np.ndarray) -> np.ndarray:
        """The packed ``P = M Q`` of every compressed tensor, after orthogonalizing ``Q``."""
        if self.qs is None:
            self.qs = self._initial_qs()
        out = np.empty(self.layout.p_size, dtype=np.float32)
        at = 0
        for slot, q in zip(self.layout.compressed, self.qs):
            orthogonalize(q, self.options.epsilon)
            n = slot.rows * slot.rank
            compute_p(self.matrix(m, slot), q, out=out[at:at + n].reshape(slot.rows, slot.rank))
            at += n
        return out

    def uncompressed_buffer(self, m: np.ndarray) -> np.ndarray:
        """The packed values of the uncompressed tensors of ``M`` (one plain Allreduce)."""
        return m[self.layout.uncompressed_index]

    def q_buffer(self, m: np.ndarray, p_sum: np.ndarray) -> np.ndarray:
        """Orthogonalize each summed ``P``, then the packed ``Q = M^T P``."""
        if p_sum.shape != (self.layout.p_size,):
            raise ValueError(f"powersgd: P buffer of {p_sum.shape}, expected {self.layout.p_size}")
        p_all = p_sum.astype(np.float32, copy=True)
        out = np.empty(self.layout.q_size, dtype=np.float32)
        self.ps = []
        at_p = at_q = 0
        for slot in self.layout.compressed:
            p = p_all[at_p:at_p + slot.rows * slot.rank].reshape(slot.rows, slot.rank)
            orthogonalize(p, self.options.epsilon)
            self.ps.append(p)
            n = slot.cols * slot.rank
            compute_q(self.matrix(m, slot), p, out=out[at_q:at_q + n].reshape(slot.cols, slot.rank))
            at_p += slot.rows * slot.rank
            at_q += n
        return out

    def finish(self, m: np.ndarray, q_sum: np.ndarray, uncompressed_sum: np.ndarray,
               world_size: int, out: np.ndarray | None = None) -> np.ndarray:
        """The averaged gradient; updates the error, keeps ``Q``, counts the call."""
        lay = self.layout
        if q_sum.shape != (lay.q_size,) or uncompressed_sum.shape != (lay.uncompressed_size,):
            raise ValueError("powersgd: Q or uncompressed buffer of the wrong length")
        if len(self.ps) != len(lay.compressed):
            raise ValueError("powersgd: finish before q_buffer")
        size = np.float32(world_size)
        q_all = q_sum.astype(np.float32, copy=True)
        q_all /= size
        if out is None:
            out = np.empty(lay.size, dtype=np.float32)
        qs = []
        at = 0
        for slot, p in zip(lay.compressed, self.ps):
            q = q_all[at:at + slot.cols * slot.rank].reshape(slot.cols, slot.rank)
            decompress(p, q, out=self.matrix(out, slot))
            qs.append(q)
            at += slot.cols * slot.rank
        out[lay.uncompressed_index] = uncompressed_sum / size
        if self.error is not None:
            np.subtract(m, out, out=self.error)
        self.qs = qs if self.options.warm_start else None
        self.ps = []
        self.step += 1
        return out

    def snapshot(self) -> dict[str, np.ndarray]:
        """Everything a resumed run needs, as arrays: step, error, warm ``Q``, generator."""
        _, keys, pos, has_gauss, gauss = self.rng.get_state()
        qs = self.qs or []
        return {
            "step": np.array(self.step, dtype=np.int64),
            "error": (self.error.copy() if self.error is not None
                      else np.zeros(0, dtype=np.float32)),
            "q": (np.concatenate([q.reshape(-1) for q in qs]) if qs
                  else np.zeros(0, dtype=np.float32)),
            "rng_keys": np.array(keys, dtype=np.uint32),
            "rng_rest": np.array([pos, has_gauss], dtype=np.int64),
            "rng_gauss": np.array(gauss, dtype=np.float64),
        }

    def restore(self, saved: dict[str, np.ndarray]) -> None:
        """Set this state from :meth:`snapshot` of a state with the same options and shapes."""
        error, q = saved["error"], saved["q"]
        if (self.error is None) != (error.size == 0) or \
                (self.error is not None and error.shape != self.error.shape):
            raise ValueError(f"powersgd: saved error of {error.size} elements does not fit "
                             f"this state ({self.layout.size}, error feedback "
                             f"{self.options.error_feedback})")
        if q.size not in (0, self.layout.q_size):
            raise ValueError(f"powersgd: saved Q of {q.size} elements, expected "
                             f"{self.layout.q_size}")
        self.step = int(saved["step"])
        if self.error is not None:
            self.error[...] = error
        self.qs = None
        if q.size:
            self.qs, at = [], 0
            for slot in self.layout.compressed:
                n = slot.cols * slot.rank
                self.qs.append(q[at:at + n].astype(np.float32).reshape(slot.cols, slot.rank))
                at += n
        pos, has_gauss = (int(v) for v in saved["rng_rest"])
        self.rng.set_state(("MT19937", saved["rng_keys"], pos, has_gauss,
                            float(saved["rng_gauss"])))
        self.ps = []

    def finish_plain(self) -> None:
        """Count a plain call (before ``start_iter``): nothing else changes."""
        if self.compressing:
            raise ValueError(f"powersgd call {self.step} is compressed, not plain")
        self.step += 1
