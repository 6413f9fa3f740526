# Sourced by the jobs/slurm batch scripts after they found SYNCBENCH_ROOT: the venv,
# the srun launcher, one thread per rank.
#
# Python (jobs/select-python.sh): $SYNCBENCH_VENV, else the activated venv ($VIRTUAL_ENV),
# else python3 on PATH, each when it imports syncbench, else $SYNCBENCH_ROOT/.venv; sbatch
# exports the submitting shell's environment, so activate (or load) and then submit. The
# chosen Python must be visible on the compute nodes at the same path. The job's first
# output line names it and why it was chosen.
#
# Variables (environment):
#   SYNCBENCH_VENV      virtual environment with syncbench (overrides the choice above)
#   SYNCBENCH_SRUN_MPI  srun's --mpi plugin (default pmi2: MPICH; pmix for Open MPI)
#   SRUN_FLAGS          extra srun flags (split on spaces)
#   OMP_NUM_THREADS     threads per rank (default 1)
# shellcheck shell=bash
# shellcheck source=jobs/select-python.sh
. "$SYNCBENCH_ROOT/jobs/select-python.sh"
select_python || exit 2
SRUN="srun --mpi=${SYNCBENCH_SRUN_MPI:-pmi2} --kill-on-bad-exit=1${SRUN_FLAGS:+ $SRUN_FLAGS}"
read -r -a SRUN_WORDS <<<"$SRUN"
# check_train_flags ARGS...: syncbench train's flags checked once, here in the batch step,
# before srun starts the tasks: a bad flag is one line and status 2 (under srun
# --kill-on-bad-exit a task still starting when another printed it would end with 143).
check_train_flags() { SYNCBENCH_CHECK_FLAGS=1 "$PY" -m syncbench train "$@"; }
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$OMP_NUM_THREADS}
export MKL_NUM_THREADS=${MKL_NUM_THREADS:-$OMP_NUM_THREADS}
echo "syncbench job ${SLURM_JOB_ID:-?}${SLURM_ARRAY_TASK_ID:+ (array task $SLURM_ARRAY_TASK_ID)}:" \
     "${SLURM_NTASKS:-?} tasks on ${SLURM_JOB_NODELIST:-?}, python $PY (from $PY_FROM)"
