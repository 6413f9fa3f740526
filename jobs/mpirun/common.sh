# Sourced by the jobs/mpirun scripts: finds the repository, its venv and the launcher.
#
# Variables (environment):
#   SYNCBENCH_VENV   virtual environment with syncbench installed (default: the repo's .venv)
#   MPIEXEC          launcher command (default: the venv's mpiexec, else mpiexec on PATH)
#   MPIEXEC_FLAGS    extra launcher flags, e.g. "-hosts n1,n2" (MPICH) or "--oversubscribe"
#                    (Open MPI); split on spaces
#   OMP_NUM_THREADS  threads per rank (default 1; also OPENBLAS/MKL_NUM_THREADS)
# shellcheck shell=bash
SYNCBENCH_ROOT=${SYNCBENCH_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
SYNCBENCH_VENV=${SYNCBENCH_VENV:-$SYNCBENCH_ROOT/.venv}
PY=$SYNCBENCH_VENV/bin/python
if [ ! -x "$PY" ]; then
    echo "$(basename "$0"): no Python at $PY: run 'make venv' or set SYNCBENCH_VENV" >&2
    exit 2
fi
if [ -z "${MPIEXEC:-}" ]; then
    if [ -x "$SYNCBENCH_VENV/bin/mpiexec" ]; then
        MPIEXEC=$SYNCBENCH_VENV/bin/mpiexec
    else
        MPIEXEC=$(command -v mpiexec || command -v mpirun || true)
    fi
fi
if [ -z "$MPIEXEC" ]; then
    echo "$(basename "$0"): no mpiexec: pip install mpich into the venv, or set MPIEXEC" >&2
    exit 2
fi
# The launcher with its flags, as one string (for syncbench's --mpiexec) and as words.
LAUNCHER="$MPIEXEC${MPIEXEC_FLAGS:+ $MPIEXEC_FLAGS}"
read -r -a LAUNCHER_WORDS <<<"$LAUNCHER"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$OMP_NUM_THREADS}
export MKL_NUM_THREADS=${MKL_NUM_THREADS:-$OMP_NUM_THREADS}
