"""The CUDA kernels and their NumPy references, checked on a machine without a GPU.

* every ``kernels/cuda/*.cu`` compiles with NVRTC (else ``nvcc -ptx``) for
  float and double, and ``compile_check`` reports a broken source as a failure;
* the NumPy references of :mod:`syncbench.kernels.ops` equal straightforward
  formulas (loops, the update rules of ALGORITHMS.md, strided convolution
  windows, BatchNorm's statistics and its input gradient by finite
  differences, the shortcut's and pooling's adjoints) and the CPU layers;
* the kernels themselves, built as C++ and run thread by thread by the host
  emulator through the real wrappers (:mod:`syncbench.kernels.cuda_ops`) and launch code,
  equal the references (bit for bit where the operations are the same), also
  with a one-block grid (grid-stride loops), and at benchmark sizes with the
  exactness rules and tolerances the GPU test applies;
* the wrappers reject mismatched shapes before any launch; ``sgd_momentum_``
  launches the per-element-decay kernel for an array decay (``MomentumSGD``
  with a decay mask, bit-identical); the reductions (bias gradient,
  BatchNorm sums, average pooling) give the same bits for any launch shape,
  and BatchNorm's sums add in the documented chunk order;
* NaN and bad labels: the kernels propagate NaN as the CPU layers do and
  ``softmax_xent`` rejects labels outside ``[0, classes)``;
* the compiled source carries the digest of ``common.cuh`` (CuPy's kernel
  cache key);
* the layers' GPU path (kernels + GEMMs), emulated the same way, gives the
  CPU path's loss and gradients; the CPU path never imports CuPy.

Split off ``tests/unit/test_cuda_kernels.py``: the tests that launch a process (``mpiexec``,
a ``syncbench`` command) or start MPI in the test's own process.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from test_cuda_kernels import SOURCES, needs_gpu_compiler


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
        bad = [n for n in sys.modules if n.startswith(("cupy", "syncbench.kernels.cuda_"))]
        assert not bad, bad
        """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
