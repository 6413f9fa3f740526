#!/usr/bin/env bash
# One-process step throughput of a commit against this tree, in alternating fresh processes.
#
# Usage: bash tools/speed_vs_commit.sh REV [PAIRS] [MODELS]
#   (default PAIRS 6, MODELS mlp,lenet,resnet8; run from the repository root)
#
# Checks REV out into a temporary worktree, puts its package folders first on
# PYTHONPATH for the "before" side, and runs `syncbench speed --out FILE.json` (3 repeats of
# 30 steps, OMP_NUM_THREADS=1) PAIRS times for each side, before then now, so a
# drift of the machine falls on both. Prints per model the median (min-max) of each
# side's samples/s and the median (min-max) of the per-pair ratios now / before.
set -euo pipefail
rev=${1:?usage: bash tools/speed_vs_commit.sh REV [PAIRS] [MODELS]}
pairs=${2:-6}
models=${3:-mlp,lenet,resnet8}
root=$(git rev-parse --show-toplevel)
py=${PYTHON:-$root/.venv/bin/python}
work=$(mktemp -d)
trap 'git -C "$root" worktree remove --force "$work/tree" >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
git -C "$root" worktree add --detach -q "$work/tree" "$rev"
mkdir -p "$work/path/syncbench"
for folder in kernels algorithms bench analysis; do
  ln -s "$work/tree/$folder" "$work/path/syncbench/$folder"
done
# The flags each side knows: a REV from before docs/FLAGS.md spells them --models, --json.
flags() {
  if PYTHONPATH=$1 "$py" -m syncbench speed --help | grep -q -- '--out FILE'; then
    echo --model --out
  else
    echo --models --json
  fi
}
read -r model_before out_before < <(cd "$work" && flags "$work/path")
read -r model_now out_now < <(cd "$work" && flags "")
for i in $(seq "$pairs"); do
  for side in before now; do
    path=; model=$model_now; out=$out_now
    [ "$side" = before ] && { path=$work/path; model=$model_before; out=$out_before; }
    (cd "$work" && OMP_NUM_THREADS=1 PYTHONPATH=$path "$py" -m syncbench speed "$model" "$models" \
      --repeats 3 --steps 30 "$out" "$work/$side.$i.json" >/dev/null)
  done
done
"$py" - "$work" "$pairs" "$rev" <<'EOF'
import json, statistics, sys
work, pairs, rev = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rates = {}
for side in ("before", "now"):
    for i in range(1, pairs + 1):
        for row in json.load(open(f"{work}/{side}.{i}.json"))["models"]:
            rates.setdefault(row["model"], {}).setdefault(side, []).append(row["median_samples_per_s"])
print(f"# syncbench speed, {pairs} alternating pairs of fresh processes: {rev} (before) and this tree (now), samples/s")
for model, sides in rates.items():
    b, n = sides["before"], sides["now"]
    r = [y / x for x, y in zip(b, n)]
    print(f"  {model:10s} before {statistics.median(b):9.1f} ({min(b):.1f}-{max(b):.1f})"
          f"  now {statistics.median(n):9.1f} ({min(n):.1f}-{max(n):.1f})"
          f"  now/before {statistics.median(r):.3f} ({min(r):.3f}-{max(r):.3f})")
EOF
