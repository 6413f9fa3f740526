#!/usr/bin/env bash
# The same training flags under several algorithms (one mpiexec each), then the comparison
# table: `syncbench compare`; arguments go to compare (and through it to train).
#
# Usage:  NP=4 jobs/mpirun/compare.sh --algorithms ssgd,odsgd --model mlp --epochs 1
#
# Variables (environment):
#   NP               ranks per run (default 4)
#   OUT_DIR          where the run files go (default runs/compare-np$NP)
#   MPIEXEC          launcher (default: the venv's mpiexec, else mpiexec on PATH)
#   MPIEXEC_FLAGS    extra launcher flags (split on spaces)
#   SYNCBENCH_VENV   virtual environment with syncbench (default: the activated venv,
#                    python3 on PATH if it has syncbench, else the repo's .venv)
#   OMP_NUM_THREADS  threads per rank (default 1)
set -euo pipefail
# shellcheck source=jobs/mpirun/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
NP=${NP:-4}
OUT_DIR=${OUT_DIR:-runs/compare-np$NP}
exec "$PY" -m syncbench compare --np "$NP" --mpiexec "$LAUNCHER" --out-dir "$OUT_DIR" "$@"
