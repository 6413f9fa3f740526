#!/usr/bin/env bash
# GPU check of syncbench on a machine with an NVIDIA GPU and nothing prepared (< 8 minutes):
#   1. creates a virtual environment and installs numpy, mpi4py, mpich, h5py, pytest,
#      pytest-mpi, CuPy and NVRTC, and this repository (pip install -e);
#   2. compiles every CUDA source (NVRTC), runs the GPU tests serially and the 2-rank
#      MPI GPU tests (SSGD on the GPU == serial large-batch SGD);
#   3. prints each kernel's time against its NumPy reference, and the training
#      throughput of a short `syncbench train --device gpu` (1 rank, then 2 ranks on
#      the same GPU with host staging) beside the same run on the CPU.
#
# Usage:  bash jobs/gpu_check.sh            (from anywhere; exits non-zero on any failure)
#
# Variables (environment):
#   VENV            virtual environment to create or reuse (default: <repo>/.venv-gpu)
#   PYTHON          interpreter that creates it (default: python3)
#   CUPY_PACKAGE    CuPy requirement (default: cupy-cuda12x[ctk], which also brings the CUDA
#                   runtime libraries from PyPI; use cupy-cuda12x with a system CUDA toolkit)
#   PIP_ARGS        extra pip flags, e.g. "--no-index --find-links /wheels" offline (split
#                   on spaces)
#   SKIP_INSTALL    1: use VENV as it is, install nothing
#   SAMPLES         synthetic training samples of the throughput runs (default 16384)
#   BATCH           per-rank batch of the throughput runs (default 128)
#   STEP_TIMEOUT    seconds allowed to each step (default 150)
#   LOG_DIR         where the run files and logs go (default: a new temporary directory)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv-gpu}
PYTHON=${PYTHON:-python3}
CUPY_PACKAGE=${CUPY_PACKAGE:-cupy-cuda12x[ctk]}
PIP_ARGS=${PIP_ARGS:-}
SKIP_INSTALL=${SKIP_INSTALL:-0}
SAMPLES=${SAMPLES:-16384}
BATCH=${BATCH:-128}
STEP_TIMEOUT=${STEP_TIMEOUT:-150}
LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/syncbench-gpu-check.XXXXXX")}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

read -r -a PIP_EXTRA <<<"$PIP_ARGS"
PY=$VENV/bin/python
START=$SECONDS

step() { printf '\n== [%3ds] %s\n' "$((SECONDS - START))" "$*"; }
run() { timeout "$STEP_TIMEOUT" "$@"; }

step "GPU"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
    echo "nvidia-smi not found (continuing: CuPy decides whether a GPU is usable)"
fi

if [ "$SKIP_INSTALL" != 1 ]; then
    step "venv $VENV and packages"
    [ -x "$PY" ] || "$PYTHON" -m venv "$VENV"
    run "$PY" -m pip install -q "${PIP_EXTRA[@]}" --upgrade pip
    run "$PY" -m pip install -q "${PIP_EXTRA[@]}" numpy mpi4py mpich h5py pytest pytest-mpi \
        "$CUPY_PACKAGE" nvidia-cuda-nvrtc-cu12
    run "$PY" -m pip install -q "${PIP_EXTRA[@]}" --no-deps -e "$ROOT"
fi

step "CuPy sees a GPU"
run "$PY" - <<'EOF'
import sys
import cupy
if not cupy.cuda.is_available():
    sys.exit("gpu_check: cupy.cuda.is_available() is False: no usable GPU or driver")
props = cupy.cuda.runtime.getDeviceProperties(0)
name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
print(f"cupy {cupy.__version__}, {cupy.cuda.runtime.getDeviceCount()} device(s), 0: {name}, "
      f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}")
EOF

cd "$ROOT"
step "compile every CUDA source (NVRTC)"
run "$PY" -m syncbench.kernels.compile_check --compiler nvrtc

step "kernel and model tests on the GPU (serial)"
run "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py tests/test_gpu.py

step "2-rank MPI tests on the GPU (SSGD equivalence, device buffers)"
run "$VENV/bin/mpiexec" -n 2 "$PY" -m pytest -q -p no:cacheprovider --with-mpi --only-mpi \
    tests/test_gpu.py

step "kernel timings: CUDA kernel vs NumPy reference (float32, medians)"
run "$PY" -m syncbench.kernels.cuda_ops --dtype float32 --repeat 10

TRAIN=(train --algorithm ssgd --model lenet --dataset synthetic --synthetic-samples "$SAMPLES"
       --batch-size "$BATCH" --epochs 1 --eval-every 0 --progress never)
step "training throughput: lenet, $SAMPLES synthetic samples, batch $BATCH"
echo "-- GPU, 1 rank"
run "$VENV/bin/syncbench" "${TRAIN[@]}" --device gpu --out "$LOG_DIR/gpu-np1.h5"
echo "-- GPU, 2 ranks on one device, host staging (--cuda-aware no)"
run "$VENV/bin/mpiexec" -n 2 "$VENV/bin/syncbench" "${TRAIN[@]}" --device gpu --cuda-aware no \
    --out "$LOG_DIR/gpu-np2.h5"
echo "-- CPU, 1 rank (same run, for the ratio; a quarter of the samples)"
run "$VENV/bin/syncbench" train --algorithm ssgd --model lenet --dataset synthetic \
    --synthetic-samples "$((SAMPLES / 4))" --batch-size "$BATCH" --epochs 1 --eval-every 0 \
    --progress never --device cpu --out "$LOG_DIR/cpu-np1.h5"
run "$PY" - "$LOG_DIR" <<'EOF'
import sys
import h5py
for name in ("gpu-np1", "gpu-np2", "cpu-np1"):
    with h5py.File(f"{sys.argv[1]}/{name}.h5") as f:
        print(f"{name}: backend={f.attrs['backend']} devices={list(f.attrs['devices'])} "
              f"cuda_aware={bool(f.attrs['cuda_aware'])} "
              f"samples/s={f['summary'].attrs['samples_per_s']:.0f} "
              f"comm_fraction={f['summary'].attrs['comm_fraction']:.3f}")
EOF

step "gpu_check passed in $((SECONDS - START)) s (run files in $LOG_DIR)"
