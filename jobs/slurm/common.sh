# Sourced by the jobs/slurm batch scripts after they found SYNCBENCH_ROOT: the venv,
# the srun launcher, one thread per rank.
#
# Variables (environment):
#   SYNCBENCH_VENV      virtual environment with syncbench (default: $SYNCBENCH_ROOT/.venv);
#                       it must be visible on the compute nodes at the same path
#   SYNCBENCH_SRUN_MPI  srun's --mpi plugin (default pmi2: MPICH; pmix for Open MPI)
#   SRUN_FLAGS          extra srun flags (split on spaces)
#   OMP_NUM_THREADS     threads per rank (default 1)
# shellcheck shell=bash
SYNCBENCH_VENV=${SYNCBENCH_VENV:-$SYNCBENCH_ROOT/.venv}
PY=$SYNCBENCH_VENV/bin/python
if [ ! -x "$PY" ]; then
    echo "syncbench job: no Python at $PY: run 'make venv' in $SYNCBENCH_ROOT or set" \
         "SYNCBENCH_VENV (or SYNCBENCH_ROOT)" >&2
    exit 2
fi
SRUN="srun --mpi=${SYNCBENCH_SRUN_MPI:-pmi2} --kill-on-bad-exit=1${SRUN_FLAGS:+ $SRUN_FLAGS}"
read -r -a SRUN_WORDS <<<"$SRUN"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$OMP_NUM_THREADS}
export MKL_NUM_THREADS=${MKL_NUM_THREADS:-$OMP_NUM_THREADS}
echo "syncbench job ${SLURM_JOB_ID:-?}${SLURM_ARRAY_TASK_ID:+ (array task $SLURM_ARRAY_TASK_ID)}:" \
     "${SLURM_NTASKS:-?} tasks on ${SLURM_JOB_NODELIST:-?}, python $PY"
