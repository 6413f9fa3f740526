"""Serial reference computations: what a distributed strategy must equal, computed in one
process, and the central differences a hand-written backward pass must match.

Every tier uses them (the in-process MPI tests compare each rank's parameters with them,
the GPU tests the device's, the unit tests a layer's gradients), so each is written once
here. They read the same batches as the ranks do (:func:`rank_streams` rebuilds every
rank's :class:`~syncbench.bench.train.stream.BatchStream`) and use the package's own model
and optimizer, so a mismatch is the strategy's arithmetic, not the oracle's. A strategy's
own recurrence (D-PSGD's gossip, Local SGD's rounds, DiLoCo's outer steps, ...) stays
beside its tests in ``tests/mpi_inproc``.
"""

from __future__ import annotations

import numpy as np

from syncbench.bench.train.stream import BatchStream

#: Central differences' step and the tolerance of a backward pass against them (float64).
EPS = 1e-6
TOL = 1e-6


def rank_streams(x, y, world_size: int, batch_size: int, seed: int, dtype=np.float64):
    """Every rank's batch stream, rebuilt in one process."""
    return [BatchStream(x, y, r, world_size, batch_size, seed, dtype=dtype)
            for r in range(world_size)]


def train_global_batch(model, optimizer, streams, steps: int):
    """One process, ``steps`` steps on the concatenation of every rank's batch (the serial
    re-computation of SSGD: the mean of the ranks' gradients is the gradient of the
    concatenated batch); returns ``model``."""
    for _ in range(steps):
        parts = [s.next() for s in streams]
        model.loss_and_grad(np.concatenate([p[0] for p in parts]),
                            np.concatenate([p[1] for p in parts]))
        optimizer.step(model.params, model.grads)
    return model


def serial_large_batch(model_name, data, world, batch, seed, config, steps):
    """SSGD's oracle for ``model_name``: one process, momentum SGD (``config``'s lr,
    momentum, weight decay) on batch ``world * batch``, the concatenation of every rank's
    batch; returns the parameters."""
    from syncbench.algorithms.optimizer import MomentumSGD
    from syncbench.kernels.zoo import build_model

    model = build_model(model_name, data.input_shape, data.num_classes, dtype=np.float64,
                        seed=seed)
    opt = MomentumSGD(model.params, config.lr, config.momentum, config.weight_decay)
    streams = rank_streams(data.train_x, data.train_y, world, batch, seed)
    return train_global_batch(model, opt, streams, steps).params


def serial_momentum_sgd(data, batch, seed, config, steps):
    """One worker's oracle (ASGD with one worker): plain momentum SGD on the mlp with the
    batches of a 1-rank job; returns the parameters."""
    return serial_large_batch("mlp", data, 1, batch, seed, config, steps)


def bind_fresh(layer, rng):
    """Give ``layer`` its own parameter/gradient arrays with random values."""
    params = [rng.standard_normal(s) for s in layer.param_shapes()]
    grads = [np.zeros(s) for s in layer.param_shapes()]
    layer.bind(params, grads)
    return params, grads


def numeric_grad(f, array, indices):
    """Central differences of scalar ``f()`` with respect to ``array[indices]``."""
    out = []
    for idx in indices:
        old = array[idx]
        array[idx] = old + EPS
        up = f()
        array[idx] = old - EPS
        down = f()
        array[idx] = old
        out.append((up - down) / (2 * EPS))
    return np.array(out)


def sample_indices(shape, rng, count=25):
    """Up to ``count`` distinct random indices of an array of ``shape``."""
    flat = rng.choice(int(np.prod(shape)), size=min(count, int(np.prod(shape))), replace=False)
    return [np.unravel_index(i, shape) for i in flat]


def assert_layer_gradients(layer, params, grads, x, rng, before_forward=lambda: None) -> None:
    """The backward pass of ``layer`` (input and parameter gradients of a random linear
    function of its output) against central differences; ``before_forward`` runs before
    every forward (BatchNorm: put the running statistics back)."""
    weight = rng.standard_normal(layer.forward(x).shape)

    def loss():
        before_forward()
        return float((layer.forward(x) * weight).sum())

    out = layer.forward(x)
    dx = layer.backward(np.ones_like(out) * weight)
    assert dx.shape == x.shape
    idx = sample_indices(x.shape, rng)
    np.testing.assert_allclose([dx[i] for i in idx], numeric_grad(loss, x, idx), atol=TOL)
    for p, g in zip(params, grads):
        idx = sample_indices(p.shape, rng)
        np.testing.assert_allclose([g[i] for i in idx], numeric_grad(loss, p, idx), atol=TOL)
