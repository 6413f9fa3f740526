#!/usr/bin/env bash
# A strong or weak scaling sweep on this machine (one mpiexec per run), then the report:
# `syncbench sweep`; arguments go to the sweep (flags it does not know go to train).
#
# Usage:  MODE=strong NP=1,2,4 jobs/mpirun/sweep.sh --algorithms ssgd,odsgd --model mlp --epochs 1
#
# Variables (environment):
#   NP               comma-separated task counts (default 1,2,4)
#   MODE             strong (fixed global batch) or weak (fixed per-rank batch); default strong
#   REPEATS          runs per point (default 1)
#   OUT_DIR          run files, manifest.json, report (default runs/sweep-$MODE)
#   MPIEXEC          launcher (default: the venv's mpiexec, else mpiexec on PATH)
#   MPIEXEC_FLAGS    extra launcher flags (split on spaces)
#   SYNCBENCH_VENV   virtual environment with syncbench (default: the activated venv,
#                    python3 on PATH if it has syncbench, else the repo's .venv)
#   OMP_NUM_THREADS  threads per rank (default 1)
set -euo pipefail
# shellcheck source=jobs/mpirun/common.sh
. "$(dirname "${BASH_SOURCE[0]}")/common.sh"
NP=${NP:-1,2,4}
MODE=${MODE:-strong}
REPEATS=${REPEATS:-1}
OUT_DIR=${OUT_DIR:-runs/sweep-$MODE}
exec "$PY" -m syncbench sweep --mode "$MODE" --np "$NP" --repeats "$REPEATS" \
    --out-dir "$OUT_DIR" --mpiexec "$LAUNCHER" "$@"
