"""The CUDA kernels and their NumPy references, checked on a machine without a GPU: the tests
that launch jobs (mpiexec, subprocesses, Slurm, the emulated cluster).

Split off unit/test_cuda_kernels.py, whose docstring says what the
module checks and why.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from test_cuda_kernels import DTYPES, SOURCES, needs_gpu_compiler, needs_gxx

from syncbench.kernels import (
    compile_check,
    cuda_bench,
    cuda_cases,
    cuda_launch,
    cuda_ops,
    layers,
    ops,
)
from syncbench.kernels.layers import MaxPool2d, ReLU
from syncbench.kernels.zoo import build_model


def _compile_check(*args: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "syncbench.kernels.compile_check", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=240)


@needs_gpu_compiler
def test_compile_check_reports_a_broken_source(tmp_path):
    broken = tmp_path / "broken.cu"
    broken.write_text(textwrap.dedent("""\
        extern "C" __global__ void broken(float* x, long long n) {
            x[0] = undefined_identifier;
        }
        """))
    proc = _compile_check(str(broken))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAILED" in proc.stdout and "undefined_identifier" in proc.stdout


@needs_gpu_compiler
def test_compile_check_passes_a_real_source():
    proc = _compile_check(str(SOURCES[0]))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 sources" in proc.stdout and "0 failed" in proc.stdout


def test_compile_check_without_a_compiler_exits_2(tmp_path):
    good = SOURCES[0]
    env_free = [sys.executable, "-c", textwrap.dedent(f"""
        import sys
        from syncbench.kernels import compile_check
        compile_check.available_compilers = lambda: []
        sys.exit(compile_check.main([{str(good)!r}]))
        """)]
    proc = subprocess.run(env_free, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "nvidia-cuda-nvrtc-cu12" in proc.stderr


def test_cpu_path_never_imports_cupy():
    code = textwrap.dedent("""
        import sys
        import numpy as np
        from syncbench.kernels.zoo import build_model
        from syncbench.kernels import ops
        from syncbench.algorithms import device_buffers
        from syncbench.algorithms.optimizer import MomentumSGD
        m = build_model("lenet", (1, 28, 28), 10, dtype=np.float64)
        m.loss_and_grad(np.zeros((2, 1, 28, 28)), np.array([1, 2]))
        MomentumSGD(m.params, 0.1, 0.9, 0.0).step(m.params, m.grads)
        ops.axpy_(m.params, 0.5, m.grads)
        from syncbench.algorithms.adamw import AdamW
        g = build_model("gpt:d=8,layers=1,heads=2,ctx=4", (4,), 7)
        g.loss_and_grad(np.zeros((2, 4), np.int64), np.ones((2, 4), np.int64))
        AdamW(g.params, 1e-3, 0.1, (0.9, 0.999), 1e-8).step(g.params, g.grads)
        bad = [n for n in sys.modules if n.startswith(("cupy", "syncbench.kernels.cuda_"))]
        assert not bad, bad
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr


# -- the kernels, emulated on the host --------------------------------------------------
def _copy(args):
    return tuple(a.copy() if isinstance(a, np.ndarray) else a for a in args)


def assert_matches(case, expected, got, dtype):
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        e, g = np.asarray(e), np.asarray(g)
        assert e.shape == g.shape and e.dtype == g.dtype, (case.name, e.dtype, g.dtype)
        if case.is_exact(False):
            np.testing.assert_array_equal(g, e, err_msg=case.name)
        else:  # the GPU test's tolerance (tests/unit/test_gpu.py)
            tol = cuda_cases.tolerance(dtype, False)
            np.testing.assert_allclose(g, e, rtol=tol, atol=tol, err_msg=case.name)


@needs_gxx
@pytest.mark.parametrize("grid", ["full", "one-block"])
@pytest.mark.parametrize("dtype", DTYPES, ids=["float", "double"])
@pytest.mark.parametrize("case", cuda_cases.CASES, ids=[c.name for c in cuda_cases.CASES])
def test_emulated_kernel_matches_reference(case, dtype, grid):
    args = case.build(np.random.default_rng(11), np.dtype(dtype), False)
    expected = cuda_cases.run_case(ops.REFERENCES[case.op], _copy(args))
    emulator = compile_check.HostEmulator(**({"max_blocks": 1, "block": 32}
                                             if grid == "one-block" else {}))
    with cuda_launch.use_launcher(emulator):
        got = cuda_cases.run_case(getattr(cuda_ops, case.op), _copy(args))
    assert emulator.launches, "no kernel was launched"
    assert_matches(case, expected, got, dtype)


@needs_gxx
def test_emulator_rejects_a_scalar_of_the_wrong_type():
    y, x = np.zeros(8, np.float32), np.ones(8, np.float32)
    with cuda_launch.use_launcher(compile_check.HostEmulator()), pytest.raises(TypeError):
        cuda_launch.launch("axpy", np.dtype(np.float32), 8, y, np.float64(2.0), x, np.int64(8))


@pytest.fixture
def emulated_gpu_path(monkeypatch):
    """Route NumPy arrays through the layers' GPU path and cuda_ops, with emulated kernels."""
    monkeypatch.setattr(layers, "_on_gpu", lambda array: True)
    monkeypatch.setattr(ops, "on_device", lambda array: True)
    with cuda_launch.use_launcher(compile_check.HostEmulator()) as emulator:
        yield emulator


@needs_gxx
@pytest.mark.parametrize("model_name", ["mlp", "lenet", "resnet8"])
def test_emulated_gpu_layer_path_equals_cpu_path(model_name, emulated_gpu_path):
    rng = np.random.default_rng(12)
    x = rng.standard_normal((3, 1, 28, 28))
    y = rng.integers(0, 10, size=3)
    cpu = build_model(model_name, (1, 28, 28), 10, dtype=np.float64, seed=5)
    gpu = build_model(model_name, (1, 28, 28), 10, dtype=np.float64, seed=5)
    with pytest.MonkeyPatch.context() as mp:  # the reference run takes the CPU path
        mp.setattr(layers, "_on_gpu", lambda array: False)
        mp.setattr(ops, "on_device", lambda array: False)
        cpu_loss = cpu.loss_and_grad(x, y)
    gpu_loss = gpu.loss_and_grad(x, y)
    launched = {name for name, _, _ in emulated_gpu_path.launches}
    assert {"softmax_xent", "relu_backward", "bias_grad_partial"} <= launched
    if model_name == "lenet":
        assert {"im2col", "col2im", "maxpool_forward", "maxpool_backward"} <= launched
    if model_name == "resnet8":  # BatchNorm, the residual blocks, strided convolutions
        assert {"bn_sums_partial", "bn_normalize", "bn_grad_sums_partial", "bn_backward",
                "add_relu", "shortcut_forward", "shortcut_backward", "avgpool_forward",
                "avgpool_backward", "im2col", "col2im"} <= launched
        np.testing.assert_allclose(gpu.buffers, cpu.buffers, rtol=1e-12, atol=1e-14)
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-12)
    np.testing.assert_allclose(gpu.grads, cpu.grads, rtol=1e-10, atol=1e-12)


@needs_gxx
def test_emulated_optimizer_step_is_bit_identical(emulated_gpu_path):
    from syncbench.algorithms.optimizer import MomentumSGD

    rng = np.random.default_rng(13)
    w, g = rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    w_cpu = w.copy()
    opt_gpu, opt_cpu = MomentumSGD(w, 0.05, 0.9, 1e-4), MomentumSGD(w_cpu, 0.05, 0.9, 1e-4)
    for _ in range(3):
        opt_gpu.step(w, g)  # dispatched to cuda_ops.sgd_momentum_ (emulated)
        ops.REFERENCES["sgd_momentum_"](w_cpu, g, opt_cpu.velocity, 0.05, 0.9, 1e-4,
                                        opt_cpu.scratch)
    assert [n for n, _, _ in emulated_gpu_path.launches] == ["sgd_momentum"] * 3
    np.testing.assert_array_equal(w, w_cpu)


@needs_gxx
def test_emulated_optimizer_step_with_exempt_parameters_is_bit_identical(emulated_gpu_path):
    """A decay mask makes the decay an array: the wrapper launches the per-element kernel."""
    from syncbench.algorithms.optimizer import MomentumSGD

    rng = np.random.default_rng(17)
    w, g = rng.standard_normal(300).astype(np.float32), rng.standard_normal(300).astype(np.float32)
    mask = (rng.random(300) < 0.6).astype(np.float32)
    w_cpu = w.copy()
    opt_gpu = MomentumSGD(w, 0.05, 0.9, 1e-4, mask)
    opt_cpu = MomentumSGD(w_cpu, 0.05, 0.9, 1e-4, mask)
    assert opt_gpu.decay.shape == w.shape and (opt_gpu.decay == 0).any()
    for _ in range(3):
        opt_gpu.step(w, g)
        ops.REFERENCES["sgd_momentum_"](w_cpu, g, opt_cpu.velocity, 0.05, 0.9, opt_cpu.decay,
                                        opt_cpu.scratch)
    assert [n for n, _, _ in emulated_gpu_path.launches] == ["sgd_momentum_array_decay"] * 3
    np.testing.assert_array_equal(w, w_cpu)
    np.testing.assert_array_equal(opt_gpu.velocity, opt_cpu.velocity)
    # a 0-d array is one decay for all, added even when zero (as the reference adds it)
    v = np.full(4, -0.0, np.float32)
    w0, g0 = np.zeros(4, np.float32), np.full(4, -0.0, np.float32)
    cuda_ops.sgd_momentum_(w0, g0, v, 0.1, 0.9, np.zeros((), np.float32))
    assert emulated_gpu_path.launches[-1][0] == "sgd_momentum_array_decay"
    assert not np.signbit(v).any()  # -0 + (0 * 0) = +0, as on the CPU


REDUCTIONS = ["bias_grad/rows-chunks", "bias_grad/channels", "bn_sums/chunks",
              "bn_grad_sums/chunks", "avgpool_forward", "layernorm_forward",
              "layernorm_backward/chunks", "causal_softmax", "causal_softmax_backward",
              "embedding_backward"]


@needs_gxx
@pytest.mark.parametrize("name", REDUCTIONS)
def test_emulated_reductions_do_not_depend_on_the_launch_shape(name):
    """No atomics: every partial sum has one thread and a fixed order, so the result is
    the same bits for any grid (deterministic on a GPU, and what the emulator gives)."""
    case = next(c for c in cuda_cases.CASES if c.name == name)
    args = case.build(np.random.default_rng(18), np.dtype(np.float32), False)
    results = []
    for shape in ({}, {"max_blocks": 1, "block": 32}, {"max_blocks": 3, "block": 7}):
        with cuda_launch.use_launcher(compile_check.HostEmulator(**shape)):
            results.append(cuda_cases.run_case(getattr(cuda_ops, case.op), _copy(args)))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            np.testing.assert_array_equal(b, a)


@needs_gxx
@pytest.mark.parametrize("op", ["bn_sums", "bn_grad_sums"])
def test_emulated_batchnorm_sums_add_in_the_documented_order(op):
    """Chunks of BN_CHUNK positions (b * h * w + pixel) summed in order, then the chunks
    in order: the kernels' result, bit for bit, computed here with float32 scalars."""
    rng = np.random.default_rng(19)
    shape = (3, 4, 10, 9)  # 270 positions per channel: two chunks, split inside a plane
    a = (2 * rng.standard_normal(shape) + 1).astype(np.float32)
    b = rng.standard_normal(shape[1] if op == "bn_sums" else shape).astype(np.float32)
    if op == "bn_sums":
        first = a - b[None, :, None, None]
        second = first * first
    else:
        first, second = a, a * b
    expected = np.empty((2, shape[1]), np.float32)
    chunk = cuda_ops.BN_CHUNK
    for row, terms in enumerate((first, second)):
        for ch in range(shape[1]):
            seq = terms[:, ch].reshape(-1)
            total = np.float32(0)
            for start in range(0, seq.size, chunk):
                part = np.float32(0)
                for t in seq[start : start + chunk]:
                    part = part + t
                total = total + part
            expected[row, ch] = total
    with cuda_launch.use_launcher(compile_check.HostEmulator()) as emulator:
        got = getattr(cuda_ops, op)(a, b)
    assert [n for n, _, _ in emulator.launches] == [f"{op}_partial", "bias_grad_finish"]
    np.testing.assert_array_equal(got, expected)


@needs_gxx
def test_emulated_sums_of_an_empty_batch_are_zero():
    """No positions: the first pass still writes one (zero) chunk per channel, so the
    finish pass never reads an unwritten partial buffer."""
    empty = np.zeros((0, 3, 4, 4), np.float32)
    with cuda_launch.use_launcher(compile_check.HostEmulator()):
        results = [cuda_ops.bias_grad(np.zeros((0, 5), np.float32)),
                   cuda_ops.bias_grad(np.zeros((5, 0), np.float32), axis=0),
                   cuda_ops.bn_sums(empty, np.ones(3, np.float32)),
                   cuda_ops.bn_grad_sums(empty, empty)]
    assert [r.shape for r in results] == [(5,), (5,), (2, 3), (2, 3)]
    assert all(not r.any() for r in results)


@needs_gxx
def test_benchmark_code_runs_on_emulated_kernels():
    with cuda_launch.use_launcher(compile_check.HostEmulator()):
        rows = cuda_bench.benchmark(np.float64, repeat=1, large=False, xp=np)
    assert [r["case"] for r in rows] == [c.name for c in cuda_cases.CASES]
    for row, case in zip(rows, cuda_cases.CASES):
        assert row["exact"] == case.exact and row["ok"], row
        if case.exact:
            assert row["max_abs_diff"] == 0.0, row
        else:
            assert row["max_rel_diff"] < 1e-12, row
    table = cuda_bench.format_table(rows)
    assert table.count("\n") == len(rows) and "speedup" in table and "cuda GB/s" in table
    # bytes moved: every input read once, every output written once (8-byte floats)
    by_name = {r["case"]: r for r in rows}
    n = 1000
    assert by_name["sgd_momentum_"]["bytes"] == 5 * n * 8  # read w, g, v; write w, v
    assert by_name["axpy_"]["bytes"] == 3 * n * 8  # read x, y; write y
    assert by_name["relu_forward"]["bytes"] == 2 * n * 8  # read x; write y
    for row in rows:
        assert row["bytes"] > 0
        assert row["cuda_gb_s"] == pytest.approx(row["bytes"] / (row["cuda_ms"] * 1e-3) / 1e9)


@needs_gxx
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [np.float32], ids=["float"])
def test_emulated_kernels_at_benchmark_size(dtype):
    """The GPU test's check (``test_kernels_at_benchmark_size_on_gpu``) on the emulator:
    the same inputs, exactness rules and tolerances, so a case that cannot pass on a GPU
    (a reduction marked exact whose order differs at this size) fails here first. In
    float32, the training dtype (float64 takes as long again, 11 s; its exactness rules
    are checked at test sizes by ``test_emulated_kernel_matches_reference``)."""
    with cuda_launch.use_launcher(compile_check.HostEmulator()):
        rows = cuda_bench.benchmark(dtype, repeat=1, large=True, xp=np)
    assert [r["case"] for r in rows] == [c.name for c in cuda_cases.CASES]
    failed = [r for r in rows if not r["ok"]]
    assert not failed, failed
    by_name = {r["case"]: r for r in rows}
    assert by_name["bias_grad/rows"]["exact"] is False  # 200704 rows: chunked sums
    assert by_name["bias_grad/rows"]["max_rel_diff"] <= cuda_cases.tolerance(dtype, True)
    assert all(r["max_abs_diff"] == 0.0 for r in rows if r["exact"])


@needs_gxx
def test_softmax_xent_kernel_never_indexes_with_a_bad_label():
    """Device labels are not read before the launch: the kernel flags the row instead."""
    logits = np.random.default_rng(0).standard_normal((3, 4))
    labels = np.array([0, 7, -2], dtype=np.int64)
    dlogits, row_loss, bad = np.empty_like(logits), np.empty(3), np.zeros(1, np.int32)
    with cuda_launch.use_launcher(compile_check.HostEmulator()):
        cuda_launch.launch("softmax_xent", np.dtype(np.float64), 3, logits, labels, dlogits,
                         row_loss, bad, np.int64(3), np.int64(4))
    assert bad[0] == 1
    assert np.isfinite(row_loss[0]) and np.isnan(row_loss[1:]).all()
    assert np.isnan(dlogits[1:]).all() and np.isfinite(dlogits[0]).all()
    cuda_ops._label_flags.append((bad, 4))
    with pytest.raises(ValueError, match="outside 0..3"):
        cuda_ops.raise_on_bad_labels()
    cuda_ops.raise_on_bad_labels()  # read once


def _with_nans(rng, shape):
    x = rng.integers(-3, 3, size=shape).astype(np.float64)
    flat = x.reshape(-1)
    flat[rng.choice(flat.size, flat.size // 5, replace=False)] = np.nan
    flat[:4] = [np.nan, -np.inf, np.inf, -0.0]
    return x


@needs_gxx
def test_emulated_kernels_propagate_nan_like_the_cpu_layers(emulated_gpu_path):
    """ReLU keeps NaN (forward and backward) and max-pool returns a window's first NaN,
    as the CPU layers do; compared with ``assert_array_equal`` (NaN == NaN)."""
    rng = np.random.default_rng(14)
    x = _with_nans(rng, (2, 3, 4, 6))
    dy = _with_nans(rng, x.shape)
    with pytest.MonkeyPatch.context() as mp, np.errstate(invalid="ignore"):
        mp.setattr(layers, "_on_gpu", lambda array: False)
        mp.setattr(ops, "on_device", lambda array: False)
        relu_cpu, pool_cpu = ReLU(), MaxPool2d(2)
        cpu = [relu_cpu.forward(x), relu_cpu.backward(dy)]
        cpu += [pool_cpu.forward(x), pool_cpu.backward(dy[:, :, ::2, ::2].copy())]
    relu_gpu, pool_gpu = ReLU(), MaxPool2d(2)
    gpu = [relu_gpu.forward(x), relu_gpu.backward(dy)]
    gpu += [pool_gpu.forward(x), pool_gpu.backward(dy[:, :, ::2, ::2].copy())]
    with np.errstate(invalid="ignore"):
        cpu.append(ops.add_relu.reference(x, dy))
    gpu.append(ops.add_relu(x, dy))  # the residual sum's ReLU keeps NaN like ReLU
    assert np.isnan(cpu[0]).any() and np.isnan(cpu[2]).any() and np.isnan(cpu[4]).any()
    for c, g in zip(cpu, gpu):
        np.testing.assert_array_equal(g, c)
    logits, labels = rng.standard_normal((3, 10)), np.array([1, 2, 3])
    logits[1, 4] = np.nan  # a NaN logit: the mean loss and that row's gradient are NaN
    with np.errstate(invalid="ignore"):
        cpu_loss, cpu_d = ops.softmax_xent.reference(logits, labels)
    gpu_loss, gpu_d = ops.softmax_xent(logits, labels)
    assert np.isnan(cpu_loss) and np.isnan(gpu_loss)
    np.testing.assert_array_equal(np.isnan(gpu_d), np.isnan(cpu_d))
    assert np.isnan(gpu_d[1]).all()


@needs_gxx
def test_every_kernel_is_launched_by_an_operation():
    """No kernel source without a caller: the cases of every operation launch them all."""
    emulator = compile_check.HostEmulator()
    with cuda_launch.use_launcher(emulator):
        for case in cuda_cases.CASES:
            args = case.build(np.random.default_rng(15), np.dtype(np.float32), False)
            cuda_cases.run_case(getattr(cuda_ops, case.op), _copy(args))
    assert {name for name, _, _ in emulator.launches} == set(cuda_launch.kernel_signatures())


# -- the transformer (gpt) and AdamW ------------------------------------------------------
TRANSFORMER_KERNELS = {"layernorm_stats", "layernorm_normalize", "layernorm_backward_stats",
                       "layernorm_backward_dx", "layernorm_param_grad_partial",
                       "bias_grad_finish", "gelu_forward", "gelu_backward",
                       "causal_softmax_forward", "causal_softmax_backward",
                       "embedding_token_grad", "embedding_position_grad", "softmax_xent"}


@needs_gxx
def test_emulated_gpt_gpu_path_equals_cpu_path(emulated_gpu_path):
    """gpt's GPU path (the transformer kernels, the GEMMs through the array module, the
    softmax_xent loss) gives the CPU path's loss and gradients in float64; windows
    shorter than the context, and a token repeated, exercise the masks and the
    scatter-add."""
    from syncbench.kernels.gpt import GPT, GPTSpec

    spec, vocab = GPTSpec(d=16, layers=2, heads=2, ctx=8), 11
    rng = np.random.default_rng(23)
    x, y = rng.integers(0, vocab, size=(3, 6)), rng.integers(0, vocab, size=(3, 6))
    x[0, :3] = 4
    cpu, gpu = (GPT(spec, vocab, dtype=np.float64, seed=7) for _ in range(2))
    with pytest.MonkeyPatch.context() as mp:  # the reference run takes the CPU path
        mp.setattr(layers, "_on_gpu", lambda array: False)
        mp.setattr(ops, "on_device", lambda array: False)
        cpu_loss = cpu.loss_and_grad(x, y)
        cpu_eval = cpu.evaluate(x, y, batch_size=2)[0]
    gpu_loss = gpu.loss_and_grad(x, y)
    launched = {name for name, _, _ in emulated_gpu_path.launches}
    assert TRANSFORMER_KERNELS <= launched, TRANSFORMER_KERNELS - launched
    assert gpu_loss == pytest.approx(cpu_loss, rel=1e-12)
    np.testing.assert_allclose(gpu.grads, cpu.grads, rtol=1e-9, atol=1e-13)
    assert gpu.evaluate(x, y, batch_size=2)[0] == pytest.approx(cpu_eval, rel=1e-12)


def _adamw_pair(decay_mask):
    from syncbench.algorithms.adamw import AdamW

    rng = np.random.default_rng(29)
    w = rng.standard_normal(300).astype(np.float32)
    w_ref = w.copy()
    opt = AdamW(w, 1e-3, 0.1, (0.9, 0.999), 1e-8, decay_mask)
    ref = AdamW(w_ref, 1e-3, 0.1, (0.9, 0.999), 1e-8, decay_mask)
    grads = [rng.standard_normal(300).astype(np.float32) for _ in range(3)]
    return w, w_ref, opt, ref, grads


@needs_gxx
@pytest.mark.parametrize("masked", [False, True], ids=["number-decay", "exempt-mask"])
def test_emulated_adamw_step_is_bit_identical(emulated_gpu_path, monkeypatch, masked):
    """AdamW on the GPU backend steps through ops.adamw_ (the fused kernel; one decay for
    all, or one per element under --wd-exempt): equal to the NumPy reference to the bit,
    moments included, over steps whose bias corrections differ."""
    from syncbench.algorithms import adamw

    monkeypatch.setattr(adamw.cpu_native, "adamw_", lambda *args: False)  # not the C pass
    mask = (np.random.default_rng(31).random(300) < 0.6).astype(np.float32) if masked \
        else None
    w, w_ref, opt, ref, grads = _adamw_pair(mask)
    for g in grads:
        opt.step(w, g)
        ref.steps += 1
        t = ref.steps
        scalars = (1 - 0.9, 0.999, 1 - 0.999, (1 - 0.999 ** t) ** 0.5, 1e-8,
                   -1e-3 / (1 - 0.9 ** t))
        ref.reference_step(w_ref, g, ref.lr, scalars)
    kernel = "adamw_array_decay" if masked else "adamw"
    assert [n for n, _, _ in emulated_gpu_path.launches] == [kernel] * 3
    np.testing.assert_array_equal(w, w_ref)
    np.testing.assert_array_equal(opt.exp_avg, ref.exp_avg)
    np.testing.assert_array_equal(opt.exp_avg_sq, ref.exp_avg_sq)
