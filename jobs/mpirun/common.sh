# Sourced by the jobs/mpirun scripts: finds the repository, the Python and the launcher,
# and prints one line saying which Python and launcher it chose.
#
# Python (jobs/select-python.sh): $SYNCBENCH_VENV, else the activated venv ($VIRTUAL_ENV),
# else python3 on PATH, each when it imports syncbench, else the repository's .venv.
#
# Variables (environment):
#   SYNCBENCH_VENV   virtual environment with syncbench (overrides the choice above)
#   MPIEXEC          launcher command (default: mpiexec next to the chosen Python, else
#                    mpiexec on PATH)
#   MPIEXEC_FLAGS    extra launcher flags, e.g. "-hosts n1,n2" (MPICH) or "--oversubscribe"
#                    (Open MPI); split on spaces
#   OMP_NUM_THREADS  threads per rank (default 1; also OPENBLAS/MKL_NUM_THREADS)
#   SYNCBENCH_CLUSTER=1, or --cluster as the script's first argument: launch across the
#                    emulated cluster that is up ('syncbench cluster mpiexec' as MPIEXEC)
# shellcheck shell=bash
SYNCBENCH_ROOT=${SYNCBENCH_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
# shellcheck source=jobs/select-python.sh
. "$SYNCBENCH_ROOT/jobs/select-python.sh"
select_python || exit 2
if [ "${1:-}" = --cluster ]; then shift; SYNCBENCH_CLUSTER=1; fi
if [ "${SYNCBENCH_CLUSTER:-0}" = 1 ]; then
    "$PY" -m syncbench cluster status >/dev/null \
        || { echo "$(basename "$0"): --cluster: no emulated cluster is up (syncbench cluster up --nodes N)" >&2; exit 2; }
    MPIEXEC="$PY -m syncbench cluster mpiexec"
fi
if [ -z "${MPIEXEC:-}" ]; then
    if [ -x "$(dirname "$PY")/mpiexec" ]; then
        MPIEXEC=$(dirname "$PY")/mpiexec
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
echo "syncbench $(basename "$0"): python $PY (from $PY_FROM), launcher $LAUNCHER"
