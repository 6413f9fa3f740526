#!/usr/bin/env bash
# The simulator's validation on the emulated cluster, in one command (as root):
#
#   bash jobs/validate_simulator.sh              (or: make validate-sim)
#   MODELS="lenet" LINKS="200mbit" REPEATS=1 bash jobs/validate_simulator.sh
#   NODES=4 MODELS=mlp LINKS=1gbit REPEATS=1 bash jobs/validate_simulator.sh
#
# NODES (default 2) is the count of emulated nodes, one rank each. At 2 it runs the
# `validation` scenario; above 2 it brings every node up at speed 0.5 (a fixed half of a
# core each: four ranks on this 2-core host never queue beyond their quota) and runs
# `validation-4nodes` (homogeneous and a 2x slower rank; no node speed of its own), the
# calibration and the workload on the same nodes and half cores.
# For each link rate (LINKS, default "1gbit 200mbit") it sets both nodes' links, fits
# the platform to the link with `syncbench comm` (allreduce, 4 B to 4 MiB, 2 ranks on
# 2 nodes; and the one-sided Accumulate's rate, for ASGD), then for each model (MODELS, default "mlp lenet resnet8") it runs the
# `validation` scenario (every strategy; homogeneous, a 2x slower rank, a node at
# speed 0.5) and `syncbench simulate --validate` on its run files, with a run of the same
# model on both nodes that never communicates as the workload (one per model, made at the
# first link; a 1-rank run per codec of the scenario's compressed runs, CODECS, their
# reducers' cost; and, at 2 nodes, the same workload run three times with the last node
# at speed 0.5, the quota's efficiency on the model: --quota-workload; at 2 nodes, per
# link and model, the compressing reducers' short collectives timed after a step of the
# model, OUT/LINK/after-step-MODEL.json: --calibrate-after-step).
# The tables go to OUT/LINK/MODEL/validation.txt and are printed (with each of the
# ranks' own host speeds, `--validate-host-speed rank`: validation-host-speed.txt, its totals
# printed), each run's row to validation.csv and validation-host-speed.csv (`syncbench
# simulate --validate-pool A/LINK/*/validation-host-speed.csv B/LINK/*/...` pools the
# sets of one link rate that several OUTs hold), the predictions to OUT/LINK/MODEL/predicted/ (`syncbench trace RUN.h5
# --beside predicted/predicted-RUN.h5 -o t.json` draws a run and its prediction side by
# side); OUT defaults to
# runs/validation (runs/validation-4nodes at NODES=4). A cluster that is already up
# (NODES nodes, one rank each) is used and
# left up, with its links restored; otherwise the script brings one up and takes it
# down on exit, whatever happened. Expect 15-25 minutes per link and model with the
# scenario's 3 repeats on a 2-core host (REPEATS=1: a third of that).
set -euo pipefail

NODES=${NODES:-2}
MODELS=${MODELS:-"mlp lenet resnet8"}
LINKS=${LINKS:-"1gbit 200mbit"}
REPEATS=${REPEATS:-3}
OUT=${OUT:-runs/validation$([ "${NODES:-2}" = 2 ] || echo "-${NODES}nodes")}
# the codecs of the scenario's compressed runs (each predicted from a 1-rank run of it)
CODECS=${CODECS:-"powersgd:2 topk:0.01"}
PY=${PY:-$(command -v python3)}
SB=("$PY" -m syncbench)
export OMP_NUM_THREADS=1
case "$NODES" in
  2) scenario=validation; up_speed=(); ranks_tag=two ;;
  [3-9]) scenario=validation-4nodes; ranks_tag=$NODES
     up_speed=(--node-speed "$(printf '0.5%.0s,' $(seq "$NODES") | sed 's/,$//')") ;;
  *) echo "validate_simulator: NODES=$NODES: give 2 to 9 nodes" >&2; exit 2 ;;
esac

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
restore_speed=""  # a node the quota workload slowed, until it is back at full speed
cleanup() {
  if [ -n "$restore_speed" ] && [ "$started" != 1 ]; then
    "${SB[@]}" cluster speed "$restore_speed" 1 >/dev/null || true
  fi
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
  if [ "$count" != "$NODES" ]; then
    echo "validate_simulator: a cluster of $count nodes is up; NODES=$NODES (syncbench cluster down first)" >&2
    exit 2
  fi
  restore_links=$("${SB[@]}" cluster status | sed -n 's/.*, links \([^ ]*\).*/\1/p' | head -1)
else
  "${SB[@]}" cluster up --nodes "$NODES" --link "$first_link" "${up_speed[@]}"
  started=1
fi

mkdir -p "$OUT"
for link in $LINKS; do
  for node in $(node_names); do "${SB[@]}" cluster link "$node" "$link"; done
  dir="$OUT/$link"
  mkdir -p "$dir"
  "${SB[@]}" cluster mpiexec -n "$NODES" -- "${SB[@]}" comm --op allreduce --max-size 4194304 \
    --iterations 20 --skip 3 --out "$dir/comm.h5" > "$dir/comm.log"
  "${SB[@]}" cluster mpiexec -n "$NODES" -- "${SB[@]}" comm --op rma-accumulate --max-size 4194304 \
    --iterations 20 --skip 3 --out "$dir/rma.h5" > "$dir/rma.log"
  for model in $MODELS; do
    # shellcheck disable=SC2046  # the model's flags are words on purpose
    flags=($(model_flags "$model"))
    # the workload: both nodes' ranks computing at once without communicating (Local SGD
    # with a period longer than the run), so that what two ranks computing side by side on
    # this host's one memory bus cost each other is in the step times the runs are
    # predicted from (lenet at 200 Mbit/s: mean |error| 18.8% from a 1-rank run, 14.1%)
    workload="$OUT/$model-$ranks_tag-ranks.h5"
    if [ ! -f "$workload" ]; then
      "${SB[@]}" cluster mpiexec -n "$NODES" -- "${SB[@]}" train --algorithm localsgd \
        --period 1000000000 "${flags[@]}" --dataset fashion-mnist --eval-every 0 \
        --progress never --out "$workload" --overwrite
    fi
    # the quota's efficiency on this model: the same run with the last node at speed 0.5
    # (2 nodes: the scenario's quota configuration), its throttled rank's CPU work a step
    # over its step's wall, against what the node's recorded pattern gives; the quota
    # set three times, as the pattern moves from one setting to the next
    quota=()
    if [ "$NODES" = 2 ]; then
      last=$(node_names | tail -1)
      for q in 1 2 3; do
        qload="$OUT/$model-quota-workload-$q.h5"
        if [ ! -f "$qload" ]; then
          restore_speed=$last
          "${SB[@]}" cluster speed "$last" 0.5 >/dev/null
          "${SB[@]}" cluster mpiexec -n "$NODES" -- "${SB[@]}" train --algorithm localsgd \
            --period 1000000000 "${flags[@]}" --dataset fashion-mnist --eval-every 0 \
            --progress never --out "$qload" --overwrite
          "${SB[@]}" cluster speed "$last" 1 >/dev/null
          restore_speed=""
        fi
        quota+=(--quota-workload "$qload")
      done
    fi
    # the scenario's codecs: a 1-rank run of each holds what its reducer costs in a step
    # and the harness around its calls; their short collectives' time after a step of
    # this model on this link (PowerSGD's P and Q, top-k's gather: 3-19 KB)
    after="$dir/after-step-$model.json"
    batch=$(echo "${flags[@]}" | sed -n 's/.*--batch-size \([0-9]*\).*/\1/p')
    if [ ! -f "$after" ] && [ "$NODES" = 2 ]; then
      "${SB[@]}" cluster mpiexec -n 2 -- "$PY" -m syncbench.bench.micro.after_idle \
        --op allreduce,allgather --sizes 2048,4096,8192,12288,16384,20480,24576 \
        --model "$model" --batch-size "${batch:-64}" --repeats 100 --out "$after" > "${after%.json}.log"
    fi
    after_flag=()
    [ -f "$after" ] && after_flag=(--calibrate-after-step "$after")
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
    "${SB[@]}" run "$scenario" --cluster --repeats "$REPEATS" --out-dir "$runs" "${flags[@]}"
    "${SB[@]}" simulate --validate "$runs"/*-r[0-9]*.h5 --workload "$workload" "${compressed[@]}" "${quota[@]}" \
      "${after_flag[@]}" --calibrate "$dir/comm.h5" --calibrate-rma "$dir/rma.h5" --validate-out "$runs/predicted" --overwrite \
      --validate-csv "$runs/validation.csv" | tee "$runs/validation.txt"
    # again with each rank's own host speed (each free rank's mean compute scales its
    # workload rank's rows): the table to read where the host's speed moved between the
    # workload and the runs, or between a run's CPUs (a KVM guest's two CPUs ran lenet
    # up to 1.5x apart within a run)
    "${SB[@]}" simulate --validate "$runs"/*-r[0-9]*.h5 --workload "$workload" "${compressed[@]}" "${quota[@]}" \
      "${after_flag[@]}" --calibrate "$dir/comm.h5" --calibrate-rma "$dir/rma.h5" --validate-host-speed rank \
      --validate-csv "$runs/validation-host-speed.csv" --overwrite > "$runs/validation-host-speed.txt"
    grep -E "^mean \|error\||a repeat off|configurations \(|^  .* by chance " "$runs/validation-host-speed.txt" | sed 's/^/with each rank'"'"'s host speed: /'
  done
done
