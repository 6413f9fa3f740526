"""``gpt``: a decoder-only transformer over the flat parameter buffer, forward and backward
written by hand.

The architecture is GPT-2's (Radford et al. 2019, section 2.3, on the
transformer decoder of Vaswani et al. 2017): token embedding plus learned
positions; ``layers`` pre-LayerNorm blocks, each ``h += attn(ln1(h))`` with
causal multi-head self-attention and ``h += mlp(ln2(h))`` with a 4 d wide
GELU (tanh approximation, as GPT-2's code) MLP; a final LayerNorm; output
logits ``h @ wte^T``, the output weights tied to the token embedding. No
dropout. The loss is the mean cross-entropy of the next token over every
position of every window, in nats per token. The operations are the NumPy
references of :mod:`syncbench.kernels.transformer_ops`.

``gpt:d=128,layers=4,heads=4,ctx=64`` names the size (any subset of the
options; those are the defaults: 834,304 parameters, which train to below 1.9 nats per
character on the held-out works in about four minutes on one core, 1.8 in seven, with
``--batch-size 8 --optimizer adamw --lr 3e-3 --beta2 0.99 --lr-schedule cosine
--lr-warmup 100``, docs/RESULTS.md; a 64-byte context as nanoGPT's CPU example).
Initialisation as GPT-2's code: weights N(0, 0.02), position embedding N(0, 0.01),
the two projections into the residual stream N(0, 0.02 / sqrt(2 layers)) (GPT-2
paper, section 2.3), biases 0, LayerNorm gains 1.

Parameters lie in the flat buffer layer by layer in forward order (the
embedding: ``wte`` (V, d), ``wpe`` (ctx, d); each block: ``ln1`` gain and
bias, ``w_qkv`` (d, 3d), ``b_qkv``, ``w_proj`` (d, d), ``b_proj``, ``ln2``
gain and bias, ``w_fc`` (d, 4d), ``b_fc``, ``w_out`` (4d, d), ``b_out``; the
final LayerNorm's gain and bias), so, as for every model here, backward
reports ``on_grads_ready(offset)`` after each layer and SSGD's buckets start
early. The tied output layer writes ``wte``'s gradient first (backward
begins there) and the embedding's backward adds its scatter to it last, so
offset 0 is reported final only at the very end.

Runs on either backend. On the CPU the GEMMs in BLAS through NumPy and the other
passes compiled (:mod:`~syncbench.kernels.cpu_transformer`: GELU, LayerNorm, the
causal softmax, the embedding's scatter-add, the loss), the NumPy references where
the library is not built; on the GPU (CuPy) the GEMMs are
cuBLAS through CuPy and the other passes the CUDA kernels of
``kernels/cuda/transformer.cu`` (LayerNorm, GELU, attention's causal softmax,
the embedding's scatter-add), dispatched by :mod:`syncbench.kernels.ops` as
the other models' layers are; the loss is the ``softmax_xent`` kernel of the
classifiers (the same mean cross-entropy).
"""

from __future__ import annotations

import dataclasses
import math
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from syncbench.kernels import cpu_native, cpu_transformer, ops
from syncbench.kernels import transformer_ops as T
from syncbench.kernels.backend import Backend, numpy_backend
from syncbench.kernels.layers import Layer, Shape, _xp
from syncbench.kernels.model import GradsReady, Model, Poll, _lay_out


@dataclass(frozen=True)
class GPTSpec:
    """The size of a ``gpt`` model: width, blocks, heads, context (tokens)."""

    d: int = 128
    layers: int = 4
    heads: int = 4
    ctx: int = 64

    def __str__(self) -> str:
        return f"gpt:d={self.d},layers={self.layers},heads={self.heads},ctx={self.ctx}"


#: Named sizes: ``gpt`` for one CPU core, ``gpt-gpu`` for a GPU (nanoGPT's Shakespeare
#: character model, ``config/train_shakespeare_char.py``: 6 blocks of width 384, 6 heads,
#: a 256-byte context; 10.8 M parameters). Options after a colon override either.
PRESETS = {"gpt": GPTSpec(), "gpt-gpu": GPTSpec(d=384, layers=6, heads=6, ctx=256)}


def parse_gpt_spec(name: str) -> GPTSpec | None:
    """The :class:`GPTSpec` of ``gpt``, ``gpt-gpu`` or either with ``:KEY=N,...`` (None
    for any other name); ``ValueError`` with one line for an unknown key, a value that is
    not a positive integer, or heads that do not divide d."""
    base, sep, options = name.partition(":")
    if base not in PRESETS:
        return None
    values: dict[str, int] = {}
    for item in options.split(",") if sep else ():
        key, eq, value = item.partition("=")
        if key not in GPTSpec.__dataclass_fields__ or not eq:
            raise ValueError(f"model {name!r}: expected gpt:d=N,layers=N,heads=N,ctx=N "
                             f"(any of them), got {item!r}")
        try:
            values[key] = int(value)
        except ValueError:
            values[key] = 0
        if values[key] < 1:
            raise ValueError(f"model {name!r}: {key} must be a positive integer")
    spec = dataclasses.replace(PRESETS[base], **values)
    if spec.d % spec.heads:
        raise ValueError(f"model {name!r}: {spec.heads} heads do not divide d={spec.d}")
    return spec


def _flat2(x: np.ndarray) -> np.ndarray:
    """(B, T, k) -> (B*T, k) view."""
    return x.reshape(-1, x.shape[-1])


def _affine(x: Any, w: Any, b: Any, residual: Any = None) -> Any:
    """``x @ w + b`` (plus ``residual``: ``residual + (x @ w + b)``) over the last axis of
    (B, T, k) ``x``: one GEMM of the flattened rows, the adds in place (the same float
    operations as the expression, without its temporaries)."""
    out = (_flat2(x) @ w).reshape(*x.shape[:-1], w.shape[-1])
    out += b
    if residual is not None:
        out += residual
    return out


def _times_transposed(x: Any, w: Any) -> Any:
    """``x @ w.T`` over the last axis of (B, T, k) ``x``: one GEMM of the flattened rows."""
    return (_flat2(x) @ w.T).reshape(*x.shape[:-1], w.shape[0])


def _merge_qkv(xp: Any, dq: Any, dk: Any, dv: Any) -> Any:
    """(B, heads, T, d_head) gradients of q, k and v -> (B, T, 3 d) in ``qkv``'s column
    order (q's heads, k's, v's), each written once into place (where merging each and
    concatenating copied twice)."""
    b, h, t, dh = dq.shape
    out = xp.empty((b, t, 3, h, dh), dtype=dq.dtype)
    for i, part in enumerate((dq, dk, dv)):
        out[:, :, i] = part.transpose(0, 2, 1, 3)
    return out.reshape(b, t, 3 * h * dh)


def _shape(x: Any) -> tuple[int, ...]:
    """The shape of an array of either backend, or of nested lists."""
    return tuple(x.shape) if hasattr(x, "shape") else np.shape(x)


# -- the passes that differ by backend: compiled or NumPy on the CPU, CUDA kernels on the GPU
def _gelu_forward(f: Any) -> tuple[Any, Any]:
    """(GELU of ``f``, its tanh term)."""
    return ops.gelu_forward(f) if ops.on_device(f) else cpu_transformer.gelu_forward(f)


def _gelu_backward(dy: Any, f: Any, tanh: Any) -> Any:
    if ops.on_device(dy):
        return ops.gelu_backward(dy, f, tanh)
    return cpu_transformer.gelu_backward(dy, f, tanh)


def _layernorm_forward(x: Any, gamma: Any, beta: Any) -> tuple[Any, Any, Any]:
    """(LayerNorm of ``x``, its normalized input, 1/std per row)."""
    if ops.on_device(x):
        return ops.layernorm_forward(x, gamma, beta)
    return cpu_transformer.layernorm_forward(x, gamma, beta)


def _layernorm_backward(dy: Any, xhat: Any, rstd: Any, gamma: Any) -> tuple[Any, Any, Any]:
    """(dx, dgamma, dbeta) of :func:`_layernorm_forward`."""
    if ops.on_device(dy):
        return ops.layernorm_backward(dy, xhat, rstd, gamma)
    return cpu_transformer.layernorm_backward(dy, xhat, rstd, gamma)


def _attention_forward(q: Any, k: Any, v: Any) -> tuple[Any, Any]:
    """:func:`~syncbench.kernels.transformer_ops.attention_forward`; on the GPU its two
    batched products in cuBLAS and the causal softmax in one kernel."""
    if not ops.on_device(q):
        return cpu_transformer.attention_forward(q, k, v)
    xp = _xp(q)
    scores = xp.matmul(q, xp.swapaxes(k, -1, -2))
    probs = ops.causal_softmax(scores, 1.0 / math.sqrt(q.shape[-1]))
    return xp.matmul(probs, v), probs


def _attention_backward(dy: Any, q: Any, k: Any, v: Any, probs: Any) -> tuple[Any, Any, Any]:
    """:func:`~syncbench.kernels.transformer_ops.attention_backward`, likewise."""
    if not ops.on_device(dy):
        return cpu_transformer.attention_backward(dy, q, k, v, probs)
    xp = _xp(dy)
    dv = xp.matmul(xp.swapaxes(probs, -1, -2), dy)
    dp = xp.matmul(dy, xp.swapaxes(v, -1, -2))
    ds = ops.causal_softmax_backward(dp, probs, 1.0 / math.sqrt(q.shape[-1]))
    return xp.matmul(ds, k), xp.matmul(xp.swapaxes(ds, -1, -2), q), dv


def _xent(logits: Any, targets: Any) -> tuple[Any, Any]:
    """Mean cross-entropy and its gradient: :func:`~syncbench.kernels.transformer_ops.
    sequence_xent` on the CPU, the ``softmax_xent`` kernel on the GPU (the loss a 0-d
    device array until read)."""
    if ops.on_device(logits):
        return ops.softmax_xent(logits, targets)
    return cpu_transformer.sequence_xent(logits, targets)


class Embedding(Layer):
    """Token rows of ``wte`` plus position rows of ``wpe``: (B, T) tokens -> (B, T, d)."""

    def __init__(self, vocab: int, ctx: int, d: int) -> None:
        super().__init__()
        self.vocab, self.ctx, self.d = vocab, ctx, d

    def param_shapes(self) -> list[Shape]:
        return [(self.vocab, self.d), (self.ctx, self.d)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [rng.normal(0.0, 0.02, (self.vocab, self.d)),
                rng.normal(0.0, 0.01, (self.ctx, self.d))]

    def param_decays(self) -> list[bool]:
        return [True, True]

    def forward(self, tokens: Any, train: bool = True) -> np.ndarray:
        self._tokens = tokens
        return T.embedding_forward(tokens, self.params[0], self.params[1])

    def backward(self, dh: np.ndarray) -> None:
        """Adds the token gradient to ``wte``'s (the output layer's is there already)."""
        if ops.on_device(dh):
            ops.embedding_backward(dh, self._tokens, self.grads[0], self.grads[1])
        else:
            cpu_transformer.embedding_backward(dh, self._tokens, self.grads[0], self.grads[1])
        self._tokens = None
        return None

    def __repr__(self) -> str:
        return f"Embedding({self.vocab}, {self.ctx}, {self.d})"


class LayerNorm(Layer):
    """LayerNorm over the last axis with a gain and a bias (the final one)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.d = d

    def param_shapes(self) -> list[Shape]:
        return [(self.d,), (self.d,)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        return [np.ones(self.d), np.zeros(self.d)]

    def forward(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        y, *self._saved = _layernorm_forward(x, self.params[0], self.params[1])
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray:
        dx, self.grads[0][...], self.grads[1][...] = _layernorm_backward(
            dy, *self._saved, self.params[0])
        self._saved = None
        return dx

    def __repr__(self) -> str:
        return f"LayerNorm({self.d})"


class Block(Layer):
    """One pre-LayerNorm transformer block: ``h + attn(ln1(h))``, then ``+ mlp(ln2(.))``."""

    #: Parameter names in flat-buffer order.
    NAMES = ("ln1_g", "ln1_b", "w_qkv", "b_qkv", "w_proj", "b_proj",
             "ln2_g", "ln2_b", "w_fc", "b_fc", "w_out", "b_out")

    def __init__(self, d: int, heads: int, depth: int) -> None:
        super().__init__()
        self.d, self.heads, self.depth = d, heads, depth

    def param_shapes(self) -> list[Shape]:
        d = self.d
        return [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,),
                (d,), (d,), (d, 4 * d), (4 * d,), (4 * d, d), (d,)]

    def init_params(self, rng: np.random.Generator) -> list[np.ndarray]:
        d, residual = self.d, 0.02 / math.sqrt(2 * self.depth)
        return [np.ones(d), np.zeros(d),
                rng.normal(0.0, 0.02, (d, 3 * d)), np.zeros(3 * d),
                rng.normal(0.0, residual, (d, d)), np.zeros(d),
                np.ones(d), np.zeros(d),
                rng.normal(0.0, 0.02, (d, 4 * d)), np.zeros(4 * d),
                rng.normal(0.0, residual, (4 * d, d)), np.zeros(d)]

    def param_decays(self) -> list[bool]:
        # the project's rule (Layer.param_decays): weights and gains decay, biases do not
        return [not name.startswith("b") and not name.endswith("_b") for name in self.NAMES]

    def forward(self, h: np.ndarray, train: bool = True) -> np.ndarray:
        p = dict(zip(self.NAMES, self.params))
        b, t, d = h.shape
        a, *ln1 = _layernorm_forward(h, p["ln1_g"], p["ln1_b"])
        qkv = _affine(a, p["w_qkv"], p["b_qkv"])
        q, k, v = (T.split_heads(qkv[..., i * d:(i + 1) * d], self.heads) for i in range(3))
        att, probs = _attention_forward(q, k, v)
        merged = T.merge_heads(att)
        h2 = _affine(merged, p["w_proj"], p["b_proj"], residual=h)
        m, *ln2 = _layernorm_forward(h2, p["ln2_g"], p["ln2_b"])
        f = _affine(m, p["w_fc"], p["b_fc"])
        g, tanh = _gelu_forward(f)
        self._saved = (a, ln1, q, k, v, probs, merged, m, ln2, f, tanh, g)
        return _affine(g, p["w_out"], p["b_out"], residual=h2)

    def backward(self, dy: np.ndarray) -> np.ndarray:
        p = dict(zip(self.NAMES, self.params))
        grad = dict(zip(self.NAMES, self.grads))
        a, ln1, q, k, v, probs, merged, m, ln2, f, tanh, g = self._saved
        self._saved = None
        d = self.d
        xp = _xp(dy)
        dy2 = _flat2(dy)
        # MLP: out = g @ w_out + b_out, g = gelu(f), f = m @ w_fc + b_fc
        xp.matmul(_flat2(g).T, dy2, out=grad["w_out"])
        xp.sum(dy2, axis=0, out=grad["b_out"])
        df = _gelu_backward(_times_transposed(dy, p["w_out"]), f, tanh)
        xp.matmul(_flat2(m).T, _flat2(df), out=grad["w_fc"])
        xp.sum(_flat2(df), axis=0, out=grad["b_fc"])
        dh2, grad["ln2_g"][...], grad["ln2_b"][...] = _layernorm_backward(
            _times_transposed(df, p["w_fc"]), *ln2, p["ln2_g"])
        dh2 += dy
        # attention: h2 = h + merged @ w_proj + b_proj
        dh2_2 = _flat2(dh2)
        xp.matmul(_flat2(merged).T, dh2_2, out=grad["w_proj"])
        xp.sum(dh2_2, axis=0, out=grad["b_proj"])
        datt = T.split_heads(_times_transposed(dh2, p["w_proj"]), self.heads)
        dq, dk, dv = _attention_backward(datt, q, k, v, probs)
        dqkv = _merge_qkv(xp, dq, dk, dv)
        dqkv2 = _flat2(dqkv)
        xp.matmul(_flat2(a).T, dqkv2, out=grad["w_qkv"])
        xp.sum(dqkv2, axis=0, out=grad["b_qkv"])
        dh, grad["ln1_g"][...], grad["ln1_b"][...] = _layernorm_backward(
            _times_transposed(dqkv, p["w_qkv"]), *ln1, p["ln1_g"])
        dh += dh2
        assert dh.shape[-1] == d
        return dh

    def __repr__(self) -> str:
        return f"Block(d={self.d}, heads={self.heads})"


def flops_per_token(spec: GPTSpec, vocab: int) -> dict[str, int]:
    """Multiply-add FLOPs (2 per multiply-add) per token of one forward pass, by part:
    the GEMMs of the blocks and the tied output layer, and attention's two batched
    products counted over the full (ctx, ctx) square as computed here (the causal half
    is masked, not skipped). A training step costs about three times the forward."""
    d, L, n = spec.d, spec.layers, spec.ctx
    blocks = 2 * L * (d * 3 * d + d * d + 2 * d * 4 * d)
    attention = 2 * L * 2 * n * d
    head = 2 * d * vocab
    return {"blocks": blocks, "attention": attention, "head": head,
            "forward": blocks + attention + head}


class GPT(Model):
    """The ``gpt`` model with :class:`Model`'s interface (flat ``params``/``grads``,
    ``loss_and_grad``, ``evaluate``, ``warm_up``) on (B, ctx) token windows."""

    def __init__(self, spec: GPTSpec, vocab: int, backend: Backend | None = None,
                 dtype: Any = np.float32, seed: int = 0, name: str | None = None) -> None:
        self.backend = backend or numpy_backend()
        if not self.backend.is_gpu:
            cpu_native.library()  # built (or found in the cache) now, not in the first step
        self.spec, self.vocab = spec, vocab
        self.name = name or str(spec)
        self.input_shape = (spec.ctx,)
        self.num_classes = vocab
        self.dtype = np.dtype(dtype)
        self.embedding = Embedding(vocab, spec.ctx, spec.d)
        self.blocks = [Block(spec.d, spec.heads, spec.layers) for _ in range(spec.layers)]
        self.final_norm = LayerNorm(spec.d)
        self.layers = [self.embedding, *self.blocks, self.final_norm]
        rng = np.random.default_rng(seed)
        shapes = [layer.param_shapes() for layer in self.layers]
        total = sum(int(np.prod(s)) for layer_shapes in shapes for s in layer_shapes)
        xp = self.backend.xp
        self.params = xp.zeros(total, dtype=self.dtype)
        self.grads = xp.zeros(total, dtype=self.dtype)
        host, self.layer_offsets, views = _lay_out(
            shapes, (layer.init_params(rng) for layer in self.layers), (self.params, self.grads))
        for layer, (pviews, gviews) in zip(self.layers, views):
            layer.bind(pviews, gviews)
        self.params[...] = self.backend.asarray(host, dtype=self.dtype)
        self.first_trained = 0
        self.buffers = xp.zeros(0, dtype=self.dtype)  # no running statistics

    def _tokens(self, x: Any) -> Any:
        """Token ids as integers on this backend's device."""
        if self.backend.is_gpu:
            return self.backend.asarray(x).astype(np.int64, copy=False)
        return T.as_tokens(x)

    def _hidden(self, x: Any, poll: Poll | None) -> np.ndarray:
        """The final LayerNorm's output (B*T, d) for token windows ``x`` (B, T)."""
        tokens = self._tokens(x)
        if tokens.ndim != 2 or tokens.shape[1] > self.spec.ctx:
            raise ValueError(f"{self.name}: expected (batch, <= {self.spec.ctx}) token windows, "
                             f"got shape {tokens.shape}")
        h = self.embedding.forward(tokens).astype(self.dtype, copy=False)
        for layer in self.layers[1:]:
            h = layer.forward(h)
            if poll is not None:
                poll()
        return _flat2(h)

    def forward(self, x: Any, train: bool = True, poll: Poll | None = None) -> np.ndarray:
        """Logits (B, T, V) for token windows ``x`` (B, T)."""
        hf = self._hidden(x, poll)
        return (hf @ self.embedding.params[0].T).reshape(*_shape(x), self.vocab)

    def loss_and_grad(self, x: Any, y: Any, on_grads_ready: GradsReady | None = None,
                      poll: Poll | None = None) -> float:
        """Mean next-token loss (nats per token) on windows ``x`` with targets ``y`` (both
        (B, T)); writes the gradient into :attr:`grads`."""
        hf = self._hidden(x, poll)
        wte, dwte = self.embedding.params[0], self.embedding.grads[0]
        loss, dlogits = _xent(hf @ wte.T, self._tokens(y).reshape(-1))
        _xp(hf).matmul(dlogits.T, hf, out=dwte)  # the tied output layer's part of wte's grad
        dh = (dlogits @ wte).reshape(*_shape(x), self.spec.d)
        for index in range(len(self.layers) - 1, -1, -1):
            dh = self.layers[index].backward(dh)
            if on_grads_ready is not None:
                on_grads_ready(self.layer_offsets[index])
        return self._read_loss(loss)

    def scratch_batch(self, rng: np.random.Generator, batch_size: int
                      ) -> tuple[np.ndarray, np.ndarray]:
        """Random token windows and targets, (batch_size, ctx) each (``--slowdown`` work)."""
        shape = (batch_size, self.spec.ctx)
        return rng.integers(0, self.vocab, shape), rng.integers(0, self.vocab, shape)

    def warm_up(self, batch_size: int) -> None:
        """One untimed step on a zero batch; the gradient is zeroed after it (on the GPU
        every kernel is compiled first, as :meth:`Model.warm_up` does)."""
        if self.backend.is_gpu:
            from syncbench.kernels import cuda_launch  # lazy: the CPU path loads no CUDA code

            cuda_launch.precompile(self.dtype)
        zeros = self.backend.xp.zeros((batch_size, self.spec.ctx), dtype=np.int64)
        self.loss_and_grad(zeros, zeros)
        self.grads[...] = 0

    def evaluate(self, x: Any, y: Any, batch_size: int | None = None) -> tuple[float, float]:
        """(mean loss in nats per token, NaN) over windows ``x`` with targets ``y``: a
        language model has no accuracy (:func:`lm_metrics` gives its measures)."""
        batch_size = batch_size or 64
        total, count = 0.0, 0
        for start in range(0, int(x.shape[0]), batch_size):
            xb, yb = x[start:start + batch_size], y[start:start + batch_size]
            hf = self._hidden(xb, None)
            loss, _ = _xent(hf @ self.embedding.params[0].T, self._tokens(yb).reshape(-1))
            total += self._read_loss(loss) * yb.size
            count += yb.size
        return total / count, math.nan

    def generate(self, prompt: bytes, count: int, temperature: float = 0.0,
                 rng: np.random.Generator | None = None) -> bytes:
        """``count`` bytes continuing ``prompt`` (a sanity check of a trained model): each
        next byte the most likely one (``temperature`` 0) or drawn from the softmax of the
        logits over ``temperature``; the model sees the last ``ctx`` bytes."""
        tokens = list(prompt) or [ord("\n")]
        rng = rng or np.random.default_rng(0)
        for _ in range(count):
            window = np.array([tokens[-self.spec.ctx:]])
            logits = self.backend.to_numpy(self.forward(window, train=False)[0, -1])
            logits = logits.astype(np.float64)
            if temperature <= 0:
                tokens.append(int(np.argmax(logits)))
                continue
            p = np.exp((logits - logits.max()) / temperature)
            tokens.append(int(rng.choice(self.vocab, p=p / p.sum())))
        return bytes(tokens[len(prompt):]) if prompt else bytes(tokens[1:])

    def summary(self) -> str:
        fl = flops_per_token(self.spec, self.vocab)
        return (super().summary() + f"\n  forward FLOPs per token {fl['forward']:,} "
                f"(blocks {fl['blocks']:,}, attention {fl['attention']:,}, "
                f"tied output {fl['head']:,})")


def lm_metrics(loss_nats: float) -> dict[str, float]:
    """A language model's validation measures from its loss in nats per token: bits per
    token (per character on a byte-level ASCII corpus) and perplexity."""
    # a diverged model's loss can pass exp's float range: its perplexity is inf, not an error
    perplexity = math.exp(loss_nats) if loss_nats < math.log(sys.float_info.max) else math.inf
    return {"loss_nats": loss_nats, "bits_per_char": loss_nats / math.log(2.0),
            "perplexity": perplexity}
