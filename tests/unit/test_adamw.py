"""AdamW, the local optimizer part: against ``torch.optim.AdamW`` in float64, its state
through a checkpoint, its choice by ``--optimizer`` and its bad input.

The PyTorch comparison is skipped where PyTorch is not installed (the CPU wheel:
``pip install torch``). Both sides run the same operations in the same order
(``torch/optim/adam.py``, ``_single_tensor_adam``), so they agree to a few units in
the last place; PyTorch's CPU ``lerp`` and ``addcmul`` may fuse a multiply-add, which
the NumPy passes round separately: the bound below allows for that and nothing more.

Split off this module: ``tests/e2e/test_adamw_e2e.py`` (its tests that launch a process or
start MPI).
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import train_config

from syncbench.algorithms.adamw import AdamW
from syncbench.algorithms.local_optimizer import build_local_optimizer, check_local_optimizer
from syncbench.algorithms.optimizer import MomentumSGD
from syncbench.algorithms.registry import ALGORITHMS
from syncbench.kernels.zoo import build_model

#: Largest difference to PyTorch over 200 float64 steps, in units of float64's eps times
#: the vector's largest magnitude (measured: 2 for the weights).
TORCH_ULPS = 8


def _close(ours: np.ndarray, theirs: np.ndarray) -> float:
    """max |ours - theirs| in units of eps * max |theirs|."""
    scale = np.finfo(np.float64).eps * float(np.max(np.abs(theirs)))
    return float(np.max(np.abs(ours - theirs))) / scale


def _gradients(size: int, steps: int, seed: int = 0) -> list[np.ndarray]:
    """Gradients whose scale drifts over five decades, with exact zeros (eps matters)."""
    rng = np.random.default_rng(seed)
    grads = []
    for t in range(steps):
        g = rng.standard_normal(size) * 10.0 ** rng.uniform(-4, 1)
        g[rng.random(size) < 0.1] = 0.0
        grads.append(g * (1 + 0.01 * t))
    return grads


@pytest.mark.parametrize("weight_decay", [0.0, 0.05])
def test_adamw_matches_torch_in_float64(weight_decay):
    torch = pytest.importorskip("torch", reason="PyTorch is not installed (pip install torch)")
    rng = np.random.default_rng(1)
    size, steps, lr, betas, eps = 4000, 200, 3e-3, (0.85, 0.995), 1e-7
    start = rng.standard_normal(size)
    mask = (rng.random(size) < 0.7).astype(np.float64)  # --wd-exempt: 0 where exempt
    ours = start.copy()
    opt = AdamW(ours, lr, weight_decay, betas, eps, decay_mask=mask)
    decays, exempt = mask == 1, mask == 0
    # PyTorch: an exempt element is one of a parameter group with weight_decay 0
    pd = torch.tensor(start[decays], dtype=torch.float64, requires_grad=True)
    pe = torch.tensor(start[exempt], dtype=torch.float64, requires_grad=True)
    ref = torch.optim.AdamW([{"params": [pd]}, {"params": [pe], "weight_decay": 0.0}],
                            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                            foreach=False)
    worst = 0.0
    for g in _gradients(size, steps):
        opt.step(ours, g)
        pd.grad = torch.tensor(g[decays], dtype=torch.float64)
        pe.grad = torch.tensor(g[exempt], dtype=torch.float64)
        ref.step()
        theirs = np.empty(size)
        theirs[decays], theirs[exempt] = pd.detach().numpy(), pe.detach().numpy()
        worst = max(worst, _close(ours, theirs))
    assert worst <= TORCH_ULPS, worst
    state = ref.state[pd]
    assert _close(opt.exp_avg[decays], state["exp_avg"].numpy()) <= TORCH_ULPS
    assert _close(opt.exp_avg_sq[decays], state["exp_avg_sq"].numpy()) <= TORCH_ULPS
    assert opt.steps == int(state["step"]) == steps


def test_adamw_decays_exempt_elements_by_nothing_and_resumes_exactly():
    rng = np.random.default_rng(2)
    size = 500
    mask = (rng.random(size) < 0.5).astype(np.float64)
    grads = _gradients(size, 30, seed=3)
    params = rng.standard_normal(size)
    zero = np.zeros(size)
    opt = AdamW(params.copy(), 0.1, 0.5, (0.9, 0.999), 1e-8, decay_mask=mask)
    moved = params.copy()
    opt.step(moved, zero)  # a zero gradient: only the decay moves the weights
    np.testing.assert_array_equal(moved[mask == 0], params[mask == 0])
    np.testing.assert_array_equal(moved[mask == 1], params[mask == 1] * (1 - 0.1 * 0.5))

    full, a = params.copy(), AdamW(params, 1e-2, 0.01, (0.9, 0.99), 1e-8, decay_mask=mask)
    for g in grads:
        a.step(full, g)
    half, b = params.copy(), AdamW(params, 1e-2, 0.01, (0.9, 0.99), 1e-8, decay_mask=mask)
    for g in grads[:13]:
        b.step(half, g)
    saved = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in b.state().items()}
    c = AdamW(params, 1e-2, 0.01, (0.9, 0.99), 1e-8, decay_mask=mask)
    c.load_state(saved, np.asarray)
    for g in grads[13:]:
        c.step(half, g)
    np.testing.assert_array_equal(half, full)


def test_the_core_builds_the_optimizer_the_flags_choose():
    model = build_model("mlp", (1, 28, 28), 10, dtype=np.float64, seed=0)
    traits = ALGORITHMS["ssgd"].traits
    assert isinstance(build_local_optimizer(model, train_config(), traits), MomentumSGD)
    config = train_config("--optimizer", "adamw", "--beta1", "0.8", "--eps", "1e-6")
    opt = build_local_optimizer(model, config, traits)
    assert isinstance(opt, AdamW) and (opt.beta1, opt.beta2, opt.eps) == (0.8, 0.999, 1e-6)
    # DiLoCo's default inner optimizer is AdamW; --optimizer sgd chooses momentum SGD
    diloco = ALGORITHMS["diloco"].traits
    assert isinstance(build_local_optimizer(model, train_config(), diloco), AdamW)
    assert isinstance(build_local_optimizer(model, train_config("--optimizer", "sgd"), diloco),
                      MomentumSGD)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--optimizer", "adamw", "--beta1", "1"], "--beta1 must be in [0, 1), got 1.0"),
        (["--optimizer", "adamw", "--beta2", "-0.1"], "--beta2 must be in [0, 1), got -0.1"),
        (["--optimizer", "adamw", "--eps", "0"], "--eps must be > 0, got 0.0"),
        (["--algorithm", "odsgd", "--optimizer", "adamw"],
         "odsgd cannot --optimizer adamw: it steps with sgd only"),
        (["--algorithm", "diloco", "--beta2", "1"], "--beta2 must be in [0, 1), got 1.0"),
    ],
)
def test_bad_optimizer_options_are_one_line(flags, message):
    config = train_config(*flags)
    cls = ALGORITHMS[config.algorithm]
    with pytest.raises(ValueError) as err:
        check_local_optimizer(config, cls.name, cls.traits)
    assert str(err.value) == message


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("decay", ["none", "scalar", "array"])
def test_the_compiled_pass_equals_the_numpy_reference_to_the_bit(monkeypatch, dtype, decay):
    from syncbench.kernels import cpu_native

    if cpu_native.library() is None:
        pytest.skip(f"no compiled kernels: {cpu_native.status()}")
    rng = np.random.default_rng(4)
    size = 10_001
    start = rng.standard_normal(size).astype(dtype)
    mask = (rng.random(size) < 0.5).astype(dtype) if decay == "array" else None
    wd = 0.0 if decay == "none" else 0.01
    runs = []
    for numpy_only in (False, True):
        monkeypatch.setattr(cpu_native, "numpy_only", numpy_only)
        params = start.copy()
        opt = AdamW(params, 1e-3, wd, (0.9, 0.999), 1e-8, decay_mask=mask)
        for g in _gradients(size, 70, seed=5):  # past a subnormal flush (every 64 steps)
            opt.step(params, g.astype(dtype))
        runs.append((params, opt.exp_avg, opt.exp_avg_sq))
    for ours, reference in zip(*runs):
        assert ours.dtype == dtype
        np.testing.assert_array_equal(ours, reference)
    monkeypatch.setattr(cpu_native, "numpy_only", False)
    assert cpu_native.adamw_(start.copy(), start, start * 0, start * 0, wd, 1e-3,
                             (0.1, 0.999, 0.001, 1.0, 1e-8, -1e-3))
    # a NumPy float64 learning rate computes in float64 in NumPy: the reference runs
    assert cpu_native.adamw_(start.copy(), start, start * 0, start * 0, wd, np.float64(1e-3),
                             (0.1, 0.999, 0.001, 1.0, 1e-8, -1e-3)) is False
