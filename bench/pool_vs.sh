#!/usr/bin/env bash
# The pool search against an earlier build of it, side by side (issue 31): pools of 64-512 GPUs
# of two kinds (A100-40GB + V100-32GB) and three (+ H100-80GB), as bench/pool.sh makes them (8
# GPUs a node, a global batch of 512 samples, estimated profiles). Each pool is planned RUNS
# times by each binary, the two alternating so that both see the same load; the table gives
# the medians of the wall time and, per binary, the step, the GPUs the answer uses, the
# certified gap and whether --time-limit stopped it.
# Usage: bench/pool_vs.sh NEW OLD OUT_DIR
# POOLS ("kinds:gpus", default 2:64 2:128 2:256 2:512 3:64 3:128 3:256 3:512), MODELS (default
# gpt-350m), RUNS (default 3), LIMIT (each plan's --time-limit in seconds, default 60), GAP
# (each plan's --search-gap, default the planner's), MIN_GAIN (each plan's --min-gain, default
# the planner's; 0 for a gap target: the plan's gap then is the search's alone, where the
# default adds what --min-gain concedes for a simpler plan, docs/planning-choices.md).
set -euo pipefail
new=${1:?usage: bench/pool_vs.sh NEW OLD OUT_DIR}
old=${2:?usage: bench/pool_vs.sh NEW OLD OUT_DIR}
out=${3:?usage: bench/pool_vs.sh NEW OLD OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
pools=${POOLS:-"2:64 2:128 2:256 2:512 3:64 3:128 3:256 3:512"}
models=${MODELS:-gpt-350m}
runs=${RUNS:-3}
limit=${LIMIT:-60}
gap="${GAP:+--search-gap $GAP} ${MIN_GAIN:+--min-gain $MIN_GAIN}"
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for m in $models; do
  for d in A100-40GB V100-32GB H100-80GB; do
    "$new" profile --model "$root/configs/models/$m.json" --estimate --device "$d" \
      --devices "$root/configs/devices.json" -o "$tmp/$m-$d.json" >/dev/null
  done
done
# One plan: "seconds step_ms gpus gap stopped" (gap -1: none), or "error RC".
plan() {
  local bin=$1 file=$2 log=$3 start end rc=0
  start=$(date +%s.%N)
  # shellcheck disable=SC2086 # $gap is up to four words
  timeout $((limit + 30)) "$bin" plan --cluster "$file" --time-limit "$limit" $gap \
    -o "$tmp/answer.json" >"$log" 2>&1 || rc=$?
  end=$(date +%s.%N)
  python3 - "$tmp/answer.json" "$log" "$rc" "$start" "$end" <<'PY'
import json, re, sys
answer, log, rc, start, end = sys.argv[1], open(sys.argv[2]).read(), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
if rc != 0:
    print(f"error {rc}"); sys.exit()
a = json.load(open(answer))
plans = a["pipelines"] if "pipelines" in a else [a]
gpus = sum(s.get("tp", 1) * s.get("dp", 1) for p in plans for s in p["stages"])
step = a["step_ms"] if "pipelines" in a else a["iteration_ms"]
gap = a.get("optimality_gap", -1)
stopped = 1 if re.search(r"time-limit", log) and re.search(r"stopped|no certified", log) else 0
print(f"{end - start:.2f} {step:.3f} {gpus} {gap:.5f} {stopped}")
PY
}
{
  echo "# The pool search, this build against the previous one, side by side"
  echo
  echo "Global batch 512 samples, 8 GPUs a node, estimated profiles, --search-gap ${GAP:-default},"
  echo "--min-gain ${MIN_GAIN:-default},"
  echo "--time-limit $limit; $runs runs of each binary alternating, medians of the wall clock on"
  echo "this machine (load at the start: $(cut -d' ' -f1-3 /proc/loadavg))."
  echo "GPUs: those the answer uses, of the pool's; gap: certified (- none); stopped: runs that"
  echo "--time-limit stopped."
  echo
  echo "| model | pool | new s | new step ms | new GPUs | new gap | new stopped | old s | old step ms | old GPUs | old gap | old stopped | old/new step | old/new s |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} >"$out/pool_vs.md"
for m in $models; do
  for p in $pools; do
    k=${p%%:*} n=${p##*:}
    python3 "$root/bench/pool_file.py" "$tmp" "$m" "$k" "$n" 0 "$tmp/pool.json"
    : >"$tmp/new.txt"
    : >"$tmp/old.txt"
    for r in $(seq "$runs"); do
      plan "$new" "$tmp/pool.json" "$out/$m-$k-$n-new.log" >>"$tmp/new.txt"
      plan "$old" "$tmp/pool.json" "$out/$m-$k-$n-old.log" >>"$tmp/old.txt"
    done
    python3 - "$tmp/new.txt" "$tmp/old.txt" "$m" "$n" "$k" >>"$out/pool_vs.md" <<'PY'
import statistics, sys
def read(path):
    rows = [l.split() for l in open(path) if l.strip()]
    ok = [r for r in rows if r[0] != "error"]
    if not ok:
        return None, f"{rows[0][0]} {rows[0][1]}" if rows else "none"
    med = lambda i: statistics.median(float(r[i]) for r in ok)
    gaps = [float(r[3]) for r in ok]
    gap = "-" if min(gaps) < 0 else f"{100 * statistics.median(gaps):.2f}%"
    return (med(0), med(1), int(med(2)), gap, sum(int(r[4]) for r in ok)), None
new, ne = read(sys.argv[1])
old, oe = read(sys.argv[2])
m, n, k = sys.argv[3], sys.argv[4], sys.argv[5]
cell = lambda x, e: f"{x[0]:.1f} | {x[1]:.1f} | {x[2]} of {n} | {x[3]} | {x[4]}" if x else f"{e} | | | |"
ratio = lambda i: f"{old[i] / new[i]:.2f}" if new and old else ""
print(f"| {m} | {n} GPUs, {k} kinds | {cell(new, ne)} | {cell(old, oe)} | {ratio(1)} | {ratio(0)} |")
PY
    tail -1 "$out/pool_vs.md"
  done
done
