#!/usr/bin/env bash
# Regenerates the tables of docs/RESULTS.md that the suite's own commands print, each
# into OUT/NAME.md under the stamp line RESULTS.md uses (date, processor and cores, MPI,
# commit, command), for a person to compare with the recorded table and replace it.
# Tables that need root (the emulated cluster, Slurm), a GPU, or a one-off investigation
# script are not here: their sections name their commands.
#
#   tools/results.sh [OUT [NAME...]]     (make results: OUT=runs/results, every NAME)
#
# NAMEs: flops, simulate-asgd, simulate-weak, peers-speed, comm-allreduce.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/results}
shift || true
PY=${PY:-.venv/bin/python}
BIN=$(dirname "$PY")
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

declare -A COMMANDS=(
  [flops]="$PY -m syncbench.kernels.flops mlp lenet resnet8 resnet20"
  [simulate-asgd]="for n in 64 1024 16384; do $BIN/syncbench simulate --algorithm asgd --np \$n --steps 20; done"
  [simulate-weak]="$BIN/syncbench sweep --simulate --mode weak --np 8,64,512,4096,16384 --algorithms ssgd,localsgd,odsgd,oscars,asgd --steps 20 --warmup-steps 2 --stragglers 1/64:lognormal:1 --out-dir $OUT/weak"
  [peers-speed]="$BIN/syncbench peers --speed --model mlp,lenet,resnet8,resnet20 --repeats 11"
  [comm-allreduce]="$BIN/mpiexec -n 2 $BIN/syncbench comm --op allreduce --check-raw"
)
ORDER=(flops simulate-asgd simulate-weak peers-speed comm-allreduce)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=("${ORDER[@]}")
for name in "${names[@]}"; do
  [ -n "${COMMANDS[$name]+x}" ] || { echo "tools/results.sh: no table named $name (choose from ${ORDER[*]})" >&2; exit 2; }
done

# the command as a reader types it: python and the venv's commands by their names
shown() { local c=${1//$PY/python}; echo "${c//$BIN\//}"; }

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
mpi=$("$PY" -c "from mpi4py import MPI; print(' '.join(MPI.Get_library_version().splitlines()[0].split()))")
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "not a git checkout")
mkdir -p "$OUT"
for name in "${names[@]}"; do
  command=${COMMANDS[$name]}
  stamp="> **Stamp:** $(date -u +%F) · ${cpu:-processor not recorded}, $(getconf _NPROCESSORS_ONLN) cores · $mpi · $commit · \`$(shown "$command")\`"
  echo "tools/results.sh: $name -> $OUT/$name.md"
  { echo "$stamp"; echo; echo '```'; bash -c "$command"; echo '```'; } > "$OUT/$name.md.part"
  mv "$OUT/$name.md.part" "$OUT/$name.md"
done
