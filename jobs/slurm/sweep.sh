#!/usr/bin/env bash
# A strong or weak scaling sweep through Slurm: one job per task count N (a job array
# with one task per repeat, each running `syncbench sweep --np N` with srun as the
# launcher), then a report job that depends on all of them (--dependency=afterany)
# and writes OUT_DIR/manifest.json and OUT_DIR/report.md. Arguments after the script
# name go to the sweep, and the flags it does not know to `syncbench train`.
#
# Usage:  MODE=strong NPS=1,2,4 jobs/slurm/sweep.sh --algorithms ssgd,odsgd --model mlp --epochs 1
#         WAIT=1 ... blocks until the report job ends and prints the report.
#
# Variables (environment):
#   MODE                strong (fixed global batch) or weak (fixed per-rank batch); default strong
#   NPS                 comma-separated task counts (default 1,2,4)
#   REPEATS             runs per point: the array size of each task-count job (default 1)
#   OUT_DIR             run files, manifests, report (default runs/slurm-sweep-$MODE; made
#                       absolute here, so jobs find it from any working directory)
#   SBATCH_FLAGS        extra sbatch flags for every job, e.g. "-p batch -A proj -t 2:00:00"
#   SERIAL              1: one run at a time (array throttled to 1 task, each task-count
#                       job after the previous), so runs sharing nodes do not disturb
#                       each other's timings; 0: jobs run as resources allow. Default 1
#                       when the cluster (the partition of SBATCH_FLAGS' -p, else all
#                       of sinfo) has a single node, else 0. Runs that still overlapped
#                       on a host are flagged "overlapped" by the report and get no
#                       speedup or efficiency.
#   WAIT                1: wait until the report job has ended, then print the report
#                       (exit status 0 when every run is complete)
#   SYNCBENCH_VENV      virtual environment with syncbench (default: the activated venv,
#                       python3 on PATH if it has syncbench, else the repo's .venv)
#   SYNCBENCH_SRUN_MPI  srun --mpi plugin (default pmi2 for MPICH; pmix for Open MPI)
#   SRUN_FLAGS          extra srun flags (split on spaces)
set -euo pipefail
SYNCBENCH_ROOT=${SYNCBENCH_ROOT:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}
MODE=${MODE:-strong}
NPS=${NPS:-1,2,4}
REPEATS=${REPEATS:-1}
OUT_DIR=${OUT_DIR:-runs/slurm-sweep-$MODE}
mkdir -p "$OUT_DIR"
OUT_DIR=$(cd "$OUT_DIR" && pwd)
read -r -a EXTRA <<<"${SBATCH_FLAGS:-}"
command -v sbatch >/dev/null || { echo "sweep.sh: sbatch not found (is Slurm installed?)" >&2; exit 2; }
[[ "$REPEATS" =~ ^[1-9][0-9]*$ ]] || { echo "sweep.sh: REPEATS must be >= 1" >&2; exit 2; }

for arg in "$@"; do
    case "$arg" in
        --out-dir|--out-dir=*|--np|--np=*|--mode|--mode=*|--repeats|--repeats=*|--manifest*)
            echo "sweep.sh: set ${arg%%=*} through OUT_DIR, NPS, MODE, REPEATS" >&2; exit 2 ;;
    esac
done
export SYNCBENCH_ROOT
if [ -z "${SERIAL:-}" ]; then
    # One node: every job would share it, so run one at a time unless told otherwise.
    part=$(sed -n 's/.*\(-p\|--partition\)[ =]\([^ ]*\).*/\2/p' <<<"${SBATCH_FLAGS:-}")
    nodes=$({ sinfo -h -N -o %N ${part:+-p "$part"} 2>/dev/null || true; } | sort -u | wc -l)
    if [ "$((nodes))" = 1 ]; then SERIAL=1; else SERIAL=0; fi
    echo "sweep.sh: SERIAL=$SERIAL by default ($nodes node(s) in the cluster)"
fi
[[ "$SERIAL" =~ ^[01]$ ]] || { echo "sweep.sh: SERIAL must be 0 or 1" >&2; exit 2; }
common=(--mode "$MODE" --repeats "$REPEATS" --out-dir "$OUT_DIR")
ids=()
IFS=, read -r -a counts <<<"$NPS"
array="0-$((REPEATS - 1))"
[ "$SERIAL" = 1 ] && array="$array%1"
for n in "${counts[@]}"; do
    after=()
    [ "$SERIAL" = 1 ] && [ ${#ids[@]} -gt 0 ] && after=(--dependency="afterany:${ids[-1]}")
    # Each array task K writes OUT_DIR/manifest-npN-rK.json (sweep --repeat-index).
    id=$(sbatch --parsable -n "$n" --array="$array" "${after[@]}" \
        --job-name="syncbench-sweep-np$n" --output="$OUT_DIR/%x-%A_%a.out" "${EXTRA[@]}" \
        "$SYNCBENCH_ROOT/jobs/slurm/sweep-np.sbatch" "${common[@]}" --np "$n" \
        --manifest "$OUT_DIR/manifest-np$n.json" "$@")
    id=${id%%;*}
    echo "sweep.sh: np=$n: job $id ($REPEATS array task(s))"
    ids+=("$id")
done
dep=$(IFS=:; echo "afterany:${ids[*]}")
id=$(sbatch --parsable -n 1 --dependency="$dep" --job-name=syncbench-sweep-report \
    --output="$OUT_DIR/%x-%j.out" "${EXTRA[@]}" \
    "$SYNCBENCH_ROOT/jobs/slurm/sweep-report.sbatch" "${common[@]}" --np "$NPS" "$@")
id=${id%%;*}
echo "sweep.sh: report: job $id after $dep -> $OUT_DIR/manifest.json, $OUT_DIR/report.md"
if [ "${WAIT:-0}" = 1 ]; then
    # Poll the queue (sbatch --wait backs off to long sleeps).
    while [ -n "$(squeue -h -j "$id" -o %A 2>/dev/null)" ]; do sleep 1; done
    cat "$OUT_DIR/syncbench-sweep-report-$id.out"
    grep -q "^sweep: .* 0 failed or missing" "$OUT_DIR/syncbench-sweep-report-$id.out"
fi
