#!/usr/bin/env bash
# The simulator's validation on the emulated cluster, in one command (as root):
#
#   bash jobs/validate_simulator.sh              (or: make validate-sim)
#   MODELS="lenet" LINKS="200mbit" REPEATS=1 bash jobs/validate_simulator.sh
#
# For each link rate (LINKS, default "1gbit 200mbit") it sets both nodes' links, fits
# the platform to the link with `syncbench comm` (allreduce, 4 B to 4 MiB, 2 ranks on
# 2 nodes; and the one-sided Accumulate's rate, for ASGD), then for each model (MODELS, default "mlp lenet resnet8") it runs the
# `validation` scenario (every strategy; homogeneous, a 2x slower rank, a node at
# speed 0.5) and `syncbench simulate --validate` on its run files, with a run of the same
# model on both nodes that never communicates as the workload (one per model, made at the
# first link; and a 1-rank run per codec of the scenario's compressed runs, CODECS, their
# reducers' cost).
# The tables go to OUT/LINK/MODEL/validation.txt and are printed, the predictions to
# OUT/LINK/MODEL/predicted/ (`syncbench trace RUN.h5 --beside predicted/predicted-RUN.h5
# -o t.json` draws a run and its prediction side by side); OUT defaults to
# runs/validation. A cluster that is already up (2 nodes, one rank each) is used and
# left up, with its links restored; otherwise the script brings one up and takes it
# down on exit, whatever happened. Expect 15-25 minutes per link and model with the
# scenario's 3 repeats on a 2-core host (REPEATS=1: a third of that).
set -euo pipefail

MODELS=${MODELS:-"mlp lenet resnet8"}
LINKS=${LINKS:-"1gbit 200mbit"}
REPEATS=${REPEATS:-3}
OUT=${OUT:-runs/validation}
# the codecs of the scenario's compressed runs (each predicted from a 1-rank run of it)
CODECS=${CODECS:-"powersgd:2 topk:0.01"}
PY=${PY:-$(command -v python3)}
SB=("$PY" -m syncbench)
export OMP_NUM_THREADS=1

# Per model: the flags that make a run long enough to measure (50 to 120 steps per rank
# at 2 ranks) and short enough for the matrix; last on the runner's line, they override
# the scenario's.
model_flags() {
  case "$1" in
    mlp) echo "--model mlp --batch-size 64 --epochs 0.25" ;;
    lenet) echo "--model lenet --batch-size 64 --epochs 0.1" ;;
    resnet8) echo "--model resnet8 --batch-size 32 --epochs 0.05" ;;
    *) echo "--model $1 --epochs 0.1" ;;
  esac
}

node_names() { "${SB[@]}" cluster status 2>/dev/null | awk '$1 ~ /node[0-9]+$/ {print $1}'; }

started=0
restore_links=""
cleanup() {
  if [ "$started" = 1 ]; then
    "${SB[@]}" cluster down || true
  elif [ -n "$restore_links" ]; then
    for node in $(node_names); do "${SB[@]}" cluster link "$node" "$restore_links" >/dev/null || true; done
  fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

first_link=${LINKS%% *}
if "${SB[@]}" cluster status >/dev/null 2>&1; then
  count=$(node_names | wc -l)
  if [ "$count" != 2 ]; then
    echo "validate_simulator: a cluster of $count nodes is up; the validation needs 2 (syncbench cluster down first)" >&2
    exit 2
  fi
  restore_links=$("${SB[@]}" cluster status | sed -n 's/.*, links \([^ ]*\).*/\1/p' | head -1)
else
  "${SB[@]}" cluster up --nodes 2 --link "$first_link"
  started=1
fi

mkdir -p "$OUT"
for link in $LINKS; do
  for node in $(node_names); do "${SB[@]}" cluster link "$node" "$link"; done
  dir="$OUT/$link"
  mkdir -p "$dir"
  "${SB[@]}" cluster mpiexec -n 2 -- "${SB[@]}" comm --op allreduce --max-size 4194304 \
    --iterations 20 --skip 3 --out "$dir/comm.h5" > "$dir/comm.log"
  "${SB[@]}" cluster mpiexec -n 2 -- "${SB[@]}" comm --op rma-accumulate --max-size 4194304 \
    --iterations 20 --skip 3 --out "$dir/rma.h5" > "$dir/rma.log"
  for model in $MODELS; do
    # shellcheck disable=SC2046  # the model's flags are words on purpose
    flags=($(model_flags "$model"))
    # the workload: both nodes' ranks computing at once without communicating (Local SGD
    # with a period longer than the run), so that what two ranks computing side by side on
    # this host's one memory bus cost each other is in the step times the runs are
    # predicted from (lenet at 200 Mbit/s: mean |error| 18.8% from a 1-rank run, 14.1%)
    workload="$OUT/$model-two-ranks.h5"
    if [ ! -f "$workload" ]; then
      "${SB[@]}" cluster mpiexec -n 2 -- "${SB[@]}" train --algorithm localsgd \
        --period 1000000000 "${flags[@]}" --dataset fashion-mnist --eval-every 0 \
        --progress never --out "$workload" --overwrite
    fi
    # the scenario's codecs: a 1-rank run of each holds what its reducer costs in a step
    compressed=()
    for codec in $CODECS; do
      one="$OUT/$model-one-rank-${codec//:/-}.h5"
      if [ ! -f "$one" ]; then
        "${SB[@]}" cluster mpiexec -n 1 -- "${SB[@]}" train --algorithm ssgd --comm blocking \
          --compress "$codec" --powersgd-start 0 "${flags[@]}" --dataset fashion-mnist \
          --eval-every 0 --progress never --out "$one" --overwrite
      fi
      compressed+=(--compressed-workload "$one")
    done
    runs="$dir/$model"
    "${SB[@]}" run validation --cluster --repeats "$REPEATS" --out-dir "$runs" "${flags[@]}"
    "${SB[@]}" simulate --validate "$runs"/*-r[0-9]*.h5 --workload "$workload" "${compressed[@]}" \
      --calibrate "$dir/comm.h5" --calibrate-rma "$dir/rma.h5" --validate-out "$runs/predicted" --overwrite \
      | tee "$runs/validation.txt"
  done
done
