#!/usr/bin/env bash
# GPU check of syncbench on a machine with an NVIDIA GPU (CUDA 12 driver) and nothing prepared:
#   1. creates a virtual environment (checks first that `python3 -m venv` works) and installs
#      this repository with its [gpu] extra (CuPy 13 and only the CUDA 12 libraries the GPU
#      path loads: runtime, NVRTC, cuBLAS, about 0.8 GB of wheels, not CuPy's 1.5-2 GB
#      [ctk] set) and its [mpich] extra (the MPICH wheel), plus pytest and pytest-mpi;
#   2. probes the GPU as `--device auto` does (a trivial NVRTC kernel and a cuBLAS GEMM);
#   3. compiles every CUDA source (NVRTC), runs the kernel and GPU tests serially and the
#      2-rank MPI GPU tests (SSGD on the GPU == serial large-batch SGD, device buffers);
#   4. prints each kernel's time against its NumPy reference (benchmark sizes, with the
#      exactness check of every case), `syncbench comm` on device buffers (staged), 2-rank
#      SSGD, OD-SGD and Oscars runs on the one GPU, and the training throughput of mlp and
#      lenet on the GPU (1 rank) beside the CPU.
#
# Usage:  bash jobs/gpu_check.sh            (from anywhere; exits non-zero on any failure)
#         bash jobs/gpu_check.sh --budget   (prints the worst-case seconds and exits)
#
# Time budget: every step has its own timeout (T_* below), and their worst case, install
# included, is 555 s, under a 10-minute device allocation; BUDGET (default 590 s) also
# cuts any step to the time left, so the whole check never runs past it. Expected: install
# 1-2 min (download-bound: ~0.8 GB), probe and NVRTC compile check < 30 s, tests 1-2 min,
# kernel timings < 30 s, comm < 30 s, training runs ~1 min: about 4-6 minutes in all.
#
# Variables (environment):
#   VENV            virtual environment to create or reuse (default: <repo>/.venv-gpu)
#   PYTHON          interpreter that creates it (default: python3)
#   PIP_ARGS        extra pip flags, e.g. "--no-index --find-links /wheels" offline (split
#                   on spaces)
#   SKIP_INSTALL    1: use VENV as it is, install nothing
#   SAMPLES         synthetic training samples of the throughput runs (default 16384)
#   BATCH           per-rank batch of the throughput runs (default 128)
#   BUDGET          seconds for the whole check (default 590); a step that would run past
#                   it is cut to what is left, and the check stops when none is left
#   T_PIP T_INSTALL T_PROBE T_COMPILE T_TESTS T_MPI_TESTS T_KERNELS T_COMM T_TRAIN
#   T_THROUGHPUT T_SUMMARY   each step's timeout in seconds (defaults below; T_COMM,
#                   T_TRAIN and T_THROUGHPUT are per run: 2, 3 and 4 runs)
#   LOG_DIR         where the run files and logs go (default: a new temporary directory)
set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
VENV=${VENV:-$ROOT/.venv-gpu}
PYTHON=${PYTHON:-python3}
PIP_ARGS=${PIP_ARGS:-}
SKIP_INSTALL=${SKIP_INSTALL:-0}
SAMPLES=${SAMPLES:-16384}
BATCH=${BATCH:-128}
BUDGET=${BUDGET:-590}
T_PIP=${T_PIP:-20}              # pip upgrade
T_INSTALL=${T_INSTALL:-130}     # the [gpu] extra: ~0.8 GB of wheels
T_PROBE=${T_PROBE:-30}
T_COMPILE=${T_COMPILE:-45}
T_TESTS=${T_TESTS:-75}          # kernel and GPU tests, serial
T_MPI_TESTS=${T_MPI_TESTS:-45}
T_KERNELS=${T_KERNELS:-40}
T_COMM=${T_COMM:-20}            # each of 2 runs
T_TRAIN=${T_TRAIN:-20}          # each of 3 runs
T_THROUGHPUT=${T_THROUGHPUT:-15}  # each of 4 runs
T_SUMMARY=${T_SUMMARY:-10}
WORST=$((T_PIP + T_INSTALL + T_PROBE + T_COMPILE + T_TESTS + T_MPI_TESTS + T_KERNELS
         + 2 * T_COMM + 3 * T_TRAIN + 4 * T_THROUGHPUT + T_SUMMARY))
if [ "${1:-}" = --budget ]; then
    echo "worst case ${WORST} s (steps' timeouts), budget ${BUDGET} s"
    exit 0
fi
LOG_DIR=${LOG_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/syncbench-gpu-check.XXXXXX")}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1

read -r -a PIP_EXTRA <<<"$PIP_ARGS"
PY=$VENV/bin/python
START=$SECONDS

step() { printf '\n== [%3ds] %s\n' "$((SECONDS - START))" "$*"; }
# run LIMIT CMD...: CMD with timeout LIMIT, cut to what is left of BUDGET
run() {
    local limit=$1 left=$((BUDGET - (SECONDS - START)))
    shift
    if [ "$left" -le 0 ]; then
        echo "gpu_check: the ${BUDGET} s budget is spent" >&2
        exit 124
    fi
    timeout "$((limit < left ? limit : left))" "$@"
}

step "GPU"
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
else
    echo "nvidia-smi not found (continuing: the probe decides whether a GPU is usable)"
fi

if [ "$SKIP_INSTALL" != 1 ]; then
    step "venv $VENV and packages ([gpu] extra: CuPy 13, CUDA runtime, NVRTC, cuBLAS)"
    if [ ! -x "$PY" ]; then
        if ! "$PYTHON" -c 'import ensurepip, venv' 2>/dev/null; then
            echo "gpu_check: '$PYTHON -m venv' cannot create a virtual environment here" \
                 "(Debian/Ubuntu: apt-get install python3-venv), or pass VENV=<existing venv>" \
                 "with SKIP_INSTALL=1" >&2
            exit 2
        fi
        "$PYTHON" -m venv "$VENV"
    fi
    run "$T_PIP" "$PY" -m pip install -q "${PIP_EXTRA[@]}" --upgrade pip
    run "$T_INSTALL" "$PY" -m pip install -q "${PIP_EXTRA[@]}" -e "$ROOT[gpu,mpich]" \
        pytest pytest-mpi
    "$PY" -m pip list 2>/dev/null | grep -iE '^(cupy|nvidia-)' || true
    du -sh "$VENV" 2>/dev/null | sed 's/^/installed size: /' || true
fi

step "GPU probe (NVRTC kernel + cuBLAS GEMM, as --device auto does)"
run "$T_PROBE" "$PY" - <<'EOF'
import sys
from syncbench.kernels.backend import preload_cuda_wheels, probe_gpu
print("CUDA wheel libraries:", ", ".join(p.rsplit("/", 1)[-1] for p in preload_cuda_wheels()))
cupy, reason = probe_gpu()
if cupy is None:
    sys.exit(f"gpu_check: no usable GPU: {reason}")
props = cupy.cuda.runtime.getDeviceProperties(0)
name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
print(f"cupy {cupy.__version__}, {cupy.cuda.runtime.getDeviceCount()} device(s), 0: {name}, "
      f"CUDA runtime {cupy.cuda.runtime.runtimeGetVersion()}, "
      f"driver {cupy.cuda.runtime.driverGetVersion()}")
EOF

cd "$ROOT"
step "compile every CUDA source (NVRTC)"
run "$T_COMPILE" "$PY" -m syncbench.kernels.compile_check --compiler nvrtc

step "kernel and model tests on the GPU (serial)"
run "$T_TESTS" "$PY" -m pytest -q -p no:cacheprovider tests/test_cuda_kernels.py \
    tests/test_gpu.py

step "2-rank MPI tests on the GPU (SSGD equivalence, device buffers)"
run "$T_MPI_TESTS" "$VENV/bin/mpiexec" -n 2 "$PY" -m pytest -q -p no:cacheprovider \
    --with-mpi --only-mpi tests/test_gpu.py

step "kernel timings: CUDA kernel vs NumPy reference (float32, benchmark sizes, medians)"
run "$T_KERNELS" "$PY" -m syncbench.kernels.cuda_bench --dtype float32 --repeat 10

step "syncbench comm: Allreduce and Iallreduce of device buffers (staged), 2 ranks"
for op in allreduce iallreduce; do
    run "$T_COMM" "$VENV/bin/mpiexec" -n 2 "$VENV/bin/syncbench" comm --op "$op" \
        --buffer cupy \
        --cuda-aware no --min-size 1024 --max-size $((1 << 22)) --iterations 50 --skip 5
done

STEPS_FLAGS=(--dataset synthetic --synthetic-samples 4096 --batch-size 64 --epochs 1
             --eval-every 0 --progress never --device gpu --cuda-aware no)
step "2 ranks on one GPU: SSGD (overlap), OD-SGD, Oscars (short runs, staged buffers)"
for algo in ssgd odsgd oscars; do
    echo "-- $algo"
    run "$T_TRAIN" "$VENV/bin/mpiexec" -n 2 "$VENV/bin/syncbench" train --algorithm "$algo" \
        --model lenet \
        "${STEPS_FLAGS[@]}" --out "$LOG_DIR/$algo-np2.h5"
done

step "training throughput: $SAMPLES synthetic samples, batch $BATCH (1 rank)"
for model in mlp lenet; do
    for device in gpu cpu; do
        samples=$SAMPLES
        [ "$device" = cpu ] && samples=$((SAMPLES / 4))  # the CPU is slower: a quarter
        echo "-- $model on $device ($samples samples)"
        run "$T_THROUGHPUT" "$VENV/bin/syncbench" train --algorithm ssgd --model "$model" \
            --dataset synthetic \
            --synthetic-samples "$samples" --batch-size "$BATCH" --epochs 1 --eval-every 0 \
            --progress never --device "$device" --out "$LOG_DIR/$model-$device.h5"
    done
done
run "$T_SUMMARY" "$PY" - "$LOG_DIR" <<'EOF'
import sys
from pathlib import Path
import h5py
for path in sorted(Path(sys.argv[1]).glob("*.h5")):
    with h5py.File(path) as f:
        s = f["summary"].attrs
        print(f"{path.stem:<12} backend={f.attrs['backend']} ranks={f.attrs.get('world_size', '?')} "
              f"cuda_aware={bool(f.attrs['cuda_aware'])} samples/s={s['samples_per_s']:.0f} "
              f"comm_fraction={s['comm_fraction']:.3f} final_acc={s.get('final_accuracy', float('nan')):.3f}")
EOF

step "gpu_check passed in $((SECONDS - START)) s (run files in $LOG_DIR)"
