#!/usr/bin/env bash
# GPU check of syncbench on the GPU machine as it is: one NVIDIA H200, 16 cores, no
# network, an image with Python 3.12, cupy-cuda13x 14 on CUDA 13, numpy 2.5, h5py, mpi4py,
# pytest and matplotlib, and no MPI wheel. Nothing is downloaded: pip runs with
# --no-index, and the only packages it installs are wheels carried in the working tree.
#
# Steps (jobs/gpu_check.py runs them; each is independent: a failed or timed-out step is
# reported and the next one runs; a step that needs a GPU is skipped, with the probe's
# reason, where none is usable):
#   setup       a venv over the machine's packages (--system-site-packages, and a .pth to
#               its python3's own site-packages when that is itself a venv); which MPI
#               library mpi4py loads is checked first, and only if none loads is the carried
#               MPICH wheel installed (likewise pytest-mpi); this repository is installed
#               with --no-deps --no-build-isolation; what it used is printed
#   probe       syncbench env, the GPU probe, CuPy's package and version, CUDA-aware MPI
#   compile     every kernel with NVRTC (PTX and an sm_90 CUBIN) and nvcc -cubin -arch=sm_90
#   gpu-tests   pytest -m gpu;  mpi-tests: the 2-rank GPU tests
#   kernels     kernel GB/s on 1 GiB arrays (CUDA events over many launches) beside a
#               device-to-device copy of the same run (the ratio) and the reported peak;
#               GEMMs as the layers call them against cuBLAS; exactness at the model's sizes
#   comm        syncbench comm, 2 ranks: host buffers, device buffers staged through pinned
#               memory as training stages them, direct where the MPI is CUDA-aware
#   strategies  SSGD, OD-SGD (16 warm-up steps of 128+) and Oscars at 1 and 2 ranks on the GPU
#   throughput  samples/s of mlp, lenet and resnet8 (BatchNorm) on the GPU and the CPU
#   report      figures.json, report.md, kernels.png, comm.png, training.png, runs.tar.gz
#
# Time: the budget (420 s, 7 minutes) and every step's limit are printed FIRST; the limits
# add up to less than it, and each is cut to what is left, so the check ends within the
# budget whatever happens. Exit status: 0 all steps passed, 1 a step failed, 3 no GPU was
# usable (the GPU steps skipped; 0 instead with --allow-no-gpu), 2 a usage error.
#
# Usage:  bash jobs/gpu_check.sh --out DIR      everything that must come back goes to DIR,
#                                               at most 8 files, one of them the full log
#         bash jobs/gpu_check.sh --dry-run      the budget and the plan; runs nothing
#         bash jobs/gpu_check.sh --budget       the budget line alone
#         other options: --work DIR (scratch, default under $TMPDIR), --venv DIR (default
#         <repo>/.venv-gpu), --wheels DIR (default <repo>/.whl), --allow-no-gpu
#
# Carried wheels: <repo>/.whl/, ignored by git (.gitignore), filled on a machine with
# network by `bash jobs/gpu_wheels.sh` (the MPICH wheel, ~13 MB, and pytest-mpi, for
# Python 3.12 on manylinux x86-64). The device machine's launcher carries ignored paths
# named in its `carry` list, 64 MiB a call with the working tree: carry [".whl"] and run
#     bash jobs/gpu_check.sh --out "$OUT"
# with a 480 s limit (docs/GPU.md gives the whole call).
#
# Variables: PYTHON (the interpreter that runs the check and creates the venv; default
# python3, the machine's), OUT_DIR or OUT (default --out), VENV, WHEELS.
set -uo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PYTHON=${PYTHON:-python3}
if [ "${1:-}" = --budget ]; then
    exec "$PYTHON" - "$ROOT" <<'EOF'
import sys
sys.path.insert(0, sys.argv[1] + "/jobs")
import gpu_check
steps = gpu_check.plan(with_bodies=False)
print(f"worst case {gpu_check.worst_case(steps)} s (steps' limits), "
      f"budget {gpu_check.BUDGET_S} s")
EOF
fi
if ! command -v "$PYTHON" >/dev/null; then
    echo "gpu_check: no $PYTHON here: set PYTHON to the machine's Python 3.10+" >&2
    exit 2
fi
exec "$PYTHON" "$ROOT/jobs/gpu_check.py" "$@"
