#!/usr/bin/env bash
# Pool search bench (issue 17): pools of 64-512 GPUs of two generations (A100-40GB + V100-32GB,
# half each) and three (+ H100-80GB, a third each), 8 GPUs a node, a global batch of 512
# samples. Per pool and model: the search's wall time and candidates planned, its dp / tp /
# stages, step and most memory on a stage, against the best pipeline-only plan (the same pool
# with "dp": 1). Each plan gets TIMEOUT seconds (default 120; "timeout" in the table).
# Pools and models: POOLS ("kinds:gpus" pairs; kinds 2, 3, or v16 for the issue's A100-40GB +
# V100-16GB, half each) and MODELS; the profiles are estimated.
# Usage: bench/pool.sh BALLAST OUT_DIR
set -euo pipefail
ballast=${1:?usage: bench/pool.sh BALLAST OUT_DIR}
out=${2:?usage: bench/pool.sh BALLAST OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
timeout_s=${TIMEOUT:-120}
# LIMIT: the plan's own --time-limit in seconds (default: none); it returns the best found by
# then, with the certified gap of the homogeneous search
limit=${LIMIT:+--time-limit $LIMIT}
pools=${POOLS:-"2:64 2:128 2:256 2:512 3:64 3:128 3:256 3:512 v16:64 v16:512"}
models=${MODELS:-"gpt-350m gpt-1.3b gpt-13b"}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
devices="A100-40GB V100-32GB H100-80GB V100-16GB"
for m in $models; do
  for d in $devices; do
    "$ballast" profile --model "$root/configs/models/$m.json" --estimate --device "$d" \
      --devices "$root/configs/devices.json" -o "$tmp/$m-$d.json" >/dev/null
  done
done
# One plan: wall seconds, the pool line and the stages' memory; "timeout" or "error" instead.
plan() {
  local file=$1 log=$2 start end rc=0
  start=$(date +%s.%N)
  # shellcheck disable=SC2086 # $limit is two words or none
  timeout "$timeout_s" "$ballast" plan --cluster "$file" $limit >"$log" 2>&1 || rc=$?
  end=$(date +%s.%N)
  python3 - "$log" "$rc" "$start" "$end" <<'PY'
import re, sys
log, rc, start, end = open(sys.argv[1]).read(), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
if rc == 124:
    print(f"timeout | | | | | |"); sys.exit()
mem = re.findall(r"^\s+\d+\s+(\S+)\s+\d+\s+\d+-\d+\s+\d+\s+[\d.]+ \(\s*\d+%\) ->\s+([\d.]+) \(", log, re.M)
most = max(mem, key=lambda x: float(x[1])) if mem else ("?", "?")
mixed = re.search(r"^pool: heterogeneous pipelines.*?(\d+) pipelines planned", log, re.M)
step = re.search(r"^step: ([\d.]+) ms", log, re.M)
if rc == 0 and mixed and step:  # heterogeneous pipelines won: no certified gap
    groups = re.findall(r"^  pipelines\[\d+\]: (\S+), dp (\d+) x (\d+) stages of tp (\d+), (\d+) micro-batches", log, re.M)
    plan = "; ".join(f"{d} dp {dp} x {st}x tp{tp}, M {mb}" for d, dp, st, tp, mb in groups)
    print(f"{float(end) - float(start):.1f} | {mixed.group(1)} pipelines | heterogeneous: {plan} | "
          f"{float(step.group(1)):.1f} | - | {most[1]} ({most[0]}) |")
    sys.exit()
m = re.search(r"pool: (\d+) candidates planned.*the fastest: dp (\d+) x pp \d+ x tp \(by kind\), (\d+) micro-batches a replica;(.*)", log)
it = re.search(r"^iteration: ([\d.]+) ms", log, re.M)
searched = re.search(r"pool search: micro-batch size (\d+); of (\d+) candidates.*certified gap ([\d.]+)%", log)
if rc != 0 or m is None or it is None or searched is None:
    print(f"error {rc} | | | | | |"); sys.exit()
kinds = "; ".join(k.strip().replace(" stages of tp ", "x tp") for k in m.group(4).split(","))
print(f"{float(end) - float(start):.1f} | {m.group(1)} of {searched.group(2)} | dp {m.group(2)}, "
      f"M {m.group(3)} x {searched.group(1)}: {kinds} | {float(it.group(1)):.1f} | "
      f"{searched.group(3)}% | {most[1]} ({most[0]}) |")
PY
}
{
  echo "# Pool search bench: the best data-parallel pipeline against the best single pipeline"
  echo
  echo "Global batch 512 samples; 8 GPUs a node (NVLink 2400/1200 Gbps), 100 Gbps between nodes"
  echo "and between replicas; estimated profiles (configs/devices.json); default --search-gap."
  echo "Plan s: wall clock of \`ballast plan\` on this machine (2 cores shared with other jobs);"
  echo "candidates: planned by --repartition, of all the pool holds (the others left by their"
  echo "bounds); plan: dp, micro-batches x micro-batch size, stages x tp per kind; gap: the certified"
  echo "optimality gap. Memory: the most on a stage, GiB after recomputation. Timeout: ${timeout_s} s a"
  echo "plan; --time-limit: ${LIMIT:-none}. SIZES (e.g. \"1,2,4,8\") adds \"micro_batch_sizes\"; these:"
  echo "${SIZES:-the model size alone}. Heterogeneous: the pool's answer is pipelines of one kind each"
  echo "side by side (a replicas file); it carries no certified gap."
  echo
  echo "| model | pool | plan s | candidates | plan (stages x tp per kind) | step ms | gap | memory GiB | dp 1: plan s | candidates | plan | step ms | gap | memory GiB | speed-up |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} >"$out/pool.md"
for m in $models; do
  for p in $pools; do
    k=${p%%:*} n=${p##*:}
    for dp in 0 1; do
      python3 "$root/bench/pool_file.py" "$tmp" "$m" "$k" "$n" "$dp" "$tmp/pool-$dp.json" "${SIZES:-}"
    done
    best=$(plan "$tmp/pool-0.json" "$out/$m-$k-$n.log")
    one=$(plan "$tmp/pool-1.json" "$out/$m-$k-$n-dp1.log")
    speedup=$(python3 -c "import sys; a, b = sys.argv[1].split('|')[3], sys.argv[2].split('|')[3]
try: print(f'{float(b) / float(a):.2f}x')
except ValueError: print('')" "$best" "$one")
    label="$k kinds"
    [ "$k" = v16 ] && label="A100-40GB + V100-16GB"
    echo "| $m | $n GPUs, $label | $best $one $speedup |" | sed 's/| |$/|/' >>"$out/pool.md"
    tail -1 "$out/pool.md"
  done
done
