"""A sequential model over ONE flat parameter buffer and ONE flat gradient buffer.

Layers hold views into the two buffers, laid out in layer order. Communication
(allreduce, gradient buckets, RMA windows) therefore works on contiguous
slices of :attr:`Model.grads` / :attr:`Model.params` without any packing.
Because backward visits layers in reverse, after layer ``i`` has run every
gradient from ``layer_offsets[i]`` to the end of the buffer is final; the
``on_grads_ready`` hook reports that offset so buckets can start early.

On the GPU, kernels are queued asynchronously. :meth:`Model.loss_and_grad`
ends with a synchronization of the stream, so a caller that times it (the
``compute`` phase) measures the forward and backward kernels themselves, not
just their launches; without it the backward time would be paid in the next
synchronization, the one before MPI, and land in ``comm``. The loss stays on
the device until then (no synchronization between forward and backward) and
is read once, after it. :meth:`Model.warm_up` runs one untimed step first
(NVRTC compiles, cuBLAS handles).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from syncbench.kernels import cpu_native, ops
from syncbench.kernels.backend import Backend, numpy_backend
from syncbench.kernels.layers import (
    BatchNorm2d,
    Layer,
    Shape,
    SoftmaxCrossEntropy,
    aligned_array,
    all_layers,
    first_trained,
    fuse_relus,
)

Poll = Callable[[], None]
GradsReady = Callable[[int], None]


def _lay_out(shapes: list[list[Shape]], values: Iterable[list[np.ndarray]],
             flats: Sequence[Any]) -> tuple[np.ndarray, list[int], list[list[list[Any]]]]:
    """Every layer's arrays laid out one after another in flat buffers, in layer order.

    ``shapes``: each layer's array shapes; ``values``: each layer's initial
    values (float64, host; drawn layer by layer, in order). Returns the host
    vector of all values, each layer's starting offset, and per layer one list
    of views per array of ``flats`` (the same layout in each: parameters and
    gradients share one).
    """
    total = sum(int(np.prod(s)) for layer_shapes in shapes for s in layer_shapes)
    host = np.zeros(total, dtype=np.float64)
    offsets: list[int] = []
    views: list[list[list[Any]]] = []
    offset = 0
    for layer_shapes, layer_values in zip(shapes, values):
        offsets.append(offset)
        layer_views: list[list[Any]] = [[] for _ in flats]
        for shape, value in zip(layer_shapes, layer_values):
            size = int(np.prod(shape))
            host[offset : offset + size] = value.ravel()
            for flat, out in zip(flats, layer_views):
                out.append(flat[offset : offset + size].reshape(shape))
            offset += size
        views.append(layer_views)
    return host, offsets, views


class Model:
    """Sequential layers + softmax cross-entropy, with flat parameter/gradient buffers."""

    def __init__(
        self,
        name: str,
        layers: Sequence[Layer],
        input_shape: Shape,
        num_classes: int,
        backend: Backend | None = None,
        dtype: Any = np.float32,
        seed: int = 0,
    ) -> None:
        self.name = name
        self.layers = list(layers)
        fuse_relus(self.layers)
        self.input_shape = tuple(input_shape)
        self.num_classes = num_classes
        self.backend = backend or numpy_backend()
        self.dtype = np.dtype(dtype)
        self.loss_fn = SoftmaxCrossEntropy()
        if self.backend.name == "numpy":
            # The compiled CPU kernels are built (or found in the cache) now, not inside
            # the first timed training step.
            cpu_native.library()

        shape: Shape = self.input_shape
        for layer in self.layers:
            shape = layer.output_shape(shape)
        if shape != (num_classes,):
            raise ValueError(f"{name}: output shape {shape} does not match {num_classes} classes")

        rng = np.random.default_rng(seed)
        params = [layer.param_shapes() for layer in self.layers]
        self.params, self.grads = self._flat(params, 2)
        host_init, self.layer_offsets, views = _lay_out(
            params, (layer.init_params(rng) for layer in self.layers), (self.params, self.grads))
        for layer, (pviews, gviews) in zip(self.layers, views):
            layer.bind(pviews, gviews)
        # Backward stops at the first layer with parameters: no input gradient below it.
        self.first_trained = first_trained(self.layers)
        self.layers[self.first_trained].needs_input_grad = False
        self.params[...] = self.backend.asarray(host_init, dtype=self.dtype)
        buffers = [layer.buffer_shapes() for layer in self.layers]
        #: Every layer's state that is not trained (BatchNorm's running statistics).
        (self.buffers,) = self._flat(buffers, 1)
        host_init, _, views = _lay_out(
            buffers, (layer.init_buffers() for layer in self.layers), (self.buffers,))
        for layer, (bviews,) in zip(self.layers, views):
            layer.bind_buffers(bviews)
        self.buffers[...] = self.backend.asarray(host_init, dtype=self.dtype)

    def _flat(self, shapes: list[list[Shape]], count: int) -> list[Any]:
        """``count`` zero flat arrays on the backend, as long as ``shapes`` hold in all; on
        the host each starts on a cache line (:func:`aligned_array`), so that the compiled
        kernels' (the codecs', the optimizers') first full-width access is not split."""
        total = sum(int(np.prod(s)) for layer_shapes in shapes for s in layer_shapes)
        if self.backend.is_gpu:
            return [self.backend.xp.zeros(total, dtype=self.dtype) for _ in range(count)]
        return [aligned_array((total,), self.dtype, zero=True) for _ in range(count)]

    def all_layers(self) -> list[Layer]:
        """Every layer, those inside residual blocks included (depth first)."""
        return all_layers(self.layers)

    def batchnorm_layers(self) -> list[BatchNorm2d]:
        """The BatchNorm layers, in forward order."""
        return [layer for layer in self.all_layers() if isinstance(layer, BatchNorm2d)]

    def sync_batchnorm(self, allreduce_sum: Callable[[Any], None] | None) -> None:
        """``--sync-bn``: every BatchNorm layer sums its statistics over ranks through
        ``allreduce_sum`` (in place); None: per-rank statistics."""
        for layer in self.batchnorm_layers():
            layer.sync = allreduce_sum

    def decay_mask(self) -> Any:
        """1 where weight decay applies under ``--wd-exempt``, 0 where it does not
        (biases, BatchNorm's beta: :meth:`Layer.param_decays`), over :attr:`params`."""
        shapes = [layer.param_shapes() for layer in self.layers]
        values = ([np.full(shape, 1.0 if decays else 0.0)
                   for shape, decays in zip(layer_shapes, layer.param_decays())]
                  for layer_shapes, layer in zip(shapes, self.layers))
        host, _, _ = _lay_out(shapes, values, ())
        return self.backend.asarray(host, dtype=self.dtype)

    @property
    def size(self) -> int:
        """Number of parameters."""
        return int(self.params.size)

    @property
    def nbytes(self) -> int:
        return int(self.params.nbytes)

    def forward(self, x: Any, train: bool = True, poll: Poll | None = None) -> Any:
        """Logits for ``x``; ``poll`` runs between layers (to progress MPI requests)."""
        for layer in self.layers:
            x = layer.forward(x, train)
            if poll is not None:
                poll()
        return x

    def loss_and_grad(
        self,
        x: Any,
        y: Any,
        on_grads_ready: GradsReady | None = None,
        poll: Poll | None = None,
    ) -> float:
        """Mean loss on (x, y); writes the gradient into :attr:`grads`.

        ``on_grads_ready(offset)`` runs after each layer's backward with the
        offset from which the flat gradient is final; ``poll`` runs between
        forward layers. On the GPU the call returns once every kernel it
        queued has run (see the module docstring).
        """
        logits = self.forward(x, True, poll)
        loss = self.loss_fn.forward(logits, y)
        dy = self.loss_fn.backward()
        for index in range(len(self.layers) - 1, -1, -1):
            if index >= self.first_trained:
                dy = self.layers[index].backward(dy)
            if on_grads_ready is not None:
                on_grads_ready(self.layer_offsets[index])
        return self._read_loss(loss)

    def _read_loss(self, loss: Any) -> float:
        """The loss as a float; on the GPU after synchronizing the stream (and checking
        the label flags of the loss kernel)."""
        if self.backend.is_gpu:
            from syncbench.kernels import cuda_ops  # lazy: the CPU path loads no CUDA code

            self.backend.synchronize()
            cuda_ops.raise_on_bad_labels()
        return float(loss)

    def warm_up(self, batch_size: int) -> None:
        """One untimed forward and backward on a zero batch, the optimizer's update and the
        strategies' elementwise arithmetic on scratch copies, then zero the gradient.

        On the GPU it compiles every kernel for this dtype (NVRTC, or CuPy's
        disk cache) and creates the cuBLAS handle, which the first timed step
        would otherwise pay; the momentum update (``ops.sgd_momentum_``,
        ``ops.axpy_``) and the in-place ufuncs OD-SGD's and ASGD's compensations
        use (subtract, multiply, add with ``out=``) compile their CuPy kernels on
        first use too. Parameters are not touched.
        """
        if self.backend.is_gpu:
            from syncbench.kernels import cuda_launch  # lazy: the CPU path loads no CUDA code

            cuda_launch.precompile(self.dtype)
        xp = self.backend.xp
        x = xp.zeros((batch_size, *self.input_shape), dtype=self.dtype)
        y = xp.zeros(batch_size, dtype=np.int64)
        buffers = self.buffers.copy()  # the warm-up batch must not move running statistics
        syncs = [layer.sync for layer in self.batchnorm_layers()]
        self.sync_batchnorm(None)  # nor reduce anything: not every caller is collective
        self.loss_and_grad(x, y)
        self.buffers[...] = buffers
        for layer, sync in zip(self.batchnorm_layers(), syncs):
            layer.sync = sync
        # the update and the compensations' arithmetic, on copies of this size and dtype
        w, g = self.params.copy(), self.grads.copy()
        v, scratch = w * 0, w * 0
        ops.sgd_momentum_(w, g, v, 0.01, 0.9, 1e-4, scratch)
        ops.axpy_(w, 0.5, g, scratch)
        ops.axpy_(w, 1.0, g)
        xp.subtract(w, v, out=scratch)
        scratch *= g
        scratch += g
        w -= xp.multiply(scratch, 0.5, out=v)
        self.grads[...] = 0

    def evaluate(self, x: Any, y: Any, batch_size: int | None = None) -> tuple[float, float]:
        """(mean loss, accuracy) on a whole split, in batches, without touching grads.

        Batches of 2000 samples, 250 for the BatchNorm networks: a resnet's first
        stage unfolds 144 values per pixel (im2col), 0.45 MB per 28x28 sample in
        float32, so 2000 samples would hold about 6 GB per rank.
        """
        if batch_size is None:
            batch_size = 250 if self.batchnorm_layers() else 2000
        xp = self.backend.xp
        total_loss, correct = 0.0, 0
        n = int(x.shape[0])
        for start in range(0, n, batch_size):
            xb = self.backend.asarray(x[start : start + batch_size], dtype=self.dtype)
            yb = self.backend.asarray(y[start : start + batch_size])
            logits = self.forward(xb, train=False)
            total_loss += self.loss_fn.forward(logits, yb) * xb.shape[0]
            correct += xp.sum(logits.argmax(axis=1) == yb)
        return self._read_loss(total_loss) / n, int(correct) / n

    def summary(self) -> str:
        """One line per layer with its parameter count."""
        lines = [f"{self.name}: {self.size} parameters ({self.nbytes / 1e6:.2f} MB {self.dtype})"]
        for layer in self.layers:
            count = sum(int(np.prod(s)) for s in layer.param_shapes())
            lines.append(f"  {layer!r:<32} {count:>9}")
        return "\n".join(lines)
