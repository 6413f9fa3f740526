#!/usr/bin/env bash
# One training run under mpiexec: `syncbench train` on NP ranks; arguments go to train.
#
# Usage:  NP=4 jobs/mpirun/train.sh --algorithm ssgd --model mlp --dataset fashion-mnist --out run.h5
#
# Variables (environment):
#   NP               ranks (default 4)
#   MPIEXEC          launcher (default: the venv's mpiexec, else mpiexec on PATH)
#   MPIEXEC_FLAGS    extra launcher flags (split on spaces)
#   SYNCBENCH_VENV   virtual environment with syncbench (default: the activated venv,
#                    python3 on PATH if it has syncbench, else the repo's .venv)
#   OMP_NUM_THREADS  threads per rank (default 1)
set -euo pipefail
# shellcheck source=jobs/mpirun/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
NP=${NP:-4}
exec "${LAUNCHER_WORDS[@]}" -n "$NP" "$PY" -m syncbench train "$@"
