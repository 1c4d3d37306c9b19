#!/usr/bin/env bash
# fp16 bench (issue 25): the shipped clusters with V100s or T4s (GPUs without bf16 tensor cores)
# and pools of A100-40GB + V100-32GB, each model planned in bf16 and in fp16 side by side.
#   - `ballast bench` on t4-4090-4, v100-a100-8 and a10-l4-v100-16 (MODELS, default gpt-1.3b,
#     gpt-13b, llama2-7b, llama3-8b): its own "fp16 beside bf16" table (optimal+repartition's
#     step, the older GPUs' share of the work and busy time, the GPUs given no block);
#   - the pool search (POOLS, "A100 count + V100 count" pairs, default the issue's 8+8 and
#     32+32; POOL_MODELS, default llama2-7b gpt-13b): the plan, its step, the V100s' share of
#     the blocks and the GPUs of each kind left idle.
# Writes OUT_DIR/fp16.md and the bench's tables (results.md, results.csv, memory.csv) under
# OUT_DIR/fp16. Profiles are estimated.
# Usage: bench/fp16.sh BALLAST OUT_DIR
set -euo pipefail
ballast=${1:?usage: bench/fp16.sh BALLAST OUT_DIR}
out=${2:?usage: bench/fp16.sh BALLAST OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
models=${MODELS:-gpt-1.3b,gpt-13b,llama2-7b,llama3-8b}
pools=${POOLS:-"8+8 32+32"}
pool_models=${POOL_MODELS:-"llama2-7b gpt-13b"}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
clusters=$root/configs/clusters
"$ballast" bench --clusters "$clusters/t4-4090-4.json,$clusters/v100-a100-8.json,$clusters/a10-l4-v100-16.json" \
  --models "$models" --out "$tmp/bench" --no-plots >"$tmp/bench.md" 2>"$tmp/bench.log"
mkdir -p "$out/fp16"
cp "$tmp/bench/results.csv" "$tmp/bench/memory.csv" "$tmp/bench/results.md" "$out/fp16/"
{
  echo "# fp16 beside bf16: what V100s and T4s contribute"
  echo
  echo "Profiles estimated from configs/devices.json: bf16 GEMMs on GPUs without bf16 tensor cores"
  echo "(V100, T4) at their fp32 peak, fp16 GEMMs at their fp16 tensor peak (V100 125, T4 65"
  echo "TFLOP/s dense; the newer GPUs' fp16 peak equals their bf16 one). Made by"
  echo "\`bench/fp16.sh build/ballast bench/results\` (the bench's own files: fp16/)."
  echo
  sed -n '/^## fp16 beside bf16/,/^## /p' "$tmp/bench.md" | sed '$d'
  echo "## Pools of A100-40GB + V100-32GB: the pool search in bf16 and in fp16"
  echo
  echo "8 GPUs a node (NVLink 2400 / 1200 Gbps within an A100 / V100 node), 100 Gbps between"
  echo "nodes and replicas, ZeRO-1, a global batch of 64 sequences, \`ballast plan --cluster\` with"
  echo "its default search gap. Plan: per kind, dp replicas x stages x tp GPUs a stage;"
  echo "V100s' blocks: their share of the model's blocks (the embedding and head aside); idle:"
  echo "GPUs of each kind no pipeline uses. Plan s: wall clock on this machine's 2 shared cores."
  echo
  echo "| model | pool | dtype | plan | step ms | fp16 speed-up | V100s' blocks | idle A100 / V100 | plan s |"
  echo "|---|---|---|---|---:|---:|---:|---|---:|"
} >"$out/fp16.md"
for p in $pools; do
  a=${p%%+*} v=${p##*+}
  for m in $pool_models; do
    bf16_step=
    for dt in bf16 fp16; do
      model=$m
      [ "$dt" = fp16 ] && model=$m-fp16
      for d in A100-40GB V100-32GB; do
        [ -f "$tmp/$model-$d.json" ] || "$ballast" profile --model "$root/configs/models/$model.json" \
          --estimate --device "$d" -o "$tmp/$model-$d.json" >/dev/null
      done
      python3 - "$tmp" "$model" "$a" "$v" "$tmp/pool.json" <<'PY'
import json, sys
tmp, model, a, v, dst = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
kinds = [("A100-40GB", 42505273344, 2400, a), ("V100-32GB", 34089730048, 1200, v)]
json.dump({"format": "ballast-cluster/1", "schedule": "1f1b", "global_batch": 64,
           "link": {"gbps": 100, "latency_us": 5}, "dp_link": {"gbps": 100, "latency_us": 5},
           "shard_optimizer": True,
           "pool": [{"device": d, "count": n, "per_node": 8, "memory_bytes": mem,
                     "profile": f"{tmp}/{model}-{d}.json", "node_link": {"gbps": g, "latency_us": 2}}
                    for d, mem, g, n in kinds]}, open(dst, "w"))
PY
      start=$(date +%s.%N) rc=0
      "$ballast" plan --cluster "$tmp/pool.json" --quiet -o "$tmp/plan.json" >"$tmp/plan.log" 2>&1 || rc=$?
      end=$(date +%s.%N)
      if [ "$rc" != 0 ]; then
        echo "| $m | $a A100-40GB + $v V100-32GB | $dt | exit $rc: $(tail -1 "$tmp/plan.log") | | | | | |" >>"$out/fp16.md"
        continue
      fi
      row=$(python3 - "$tmp/plan.json" "$a" "$v" "$start" "$end" "${bf16_step:-}" <<'PY'
import json, sys
path, a, v, start, end, bf16 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]), sys.argv[6]
doc = json.load(open(path))
# a plan, or a replicas file of pipelines side by side (heterogeneous pipelines)
plans = doc["pipelines"] if doc["format"] == "ballast-replicas/1" else [doc]
step = doc["step_ms"] if doc["format"] == "ballast-replicas/1" else doc["iteration_ms"]
used, groups, v_blocks, blocks = {}, [], 0, 0
for p in plans:
    n_layer = p["model"]["n_layer"]
    kinds = {}
    for s in p["stages"]:
        tp, dp = s.get("tp", 1), s.get("dp", 1)
        used[s["device"]] = used.get(s["device"], 0) + tp * dp
        kinds.setdefault(s["device"], []).append(tp)
        first, last = s["layers"]
        mine = max(0, min(last, n_layer) - max(first, 1) + 1)
        # a replica's blocks count once per replica, in every pipeline
        blocks += mine * dp
        if s["device"] == "V100-32GB":
            v_blocks += mine * dp
    dp = p["stages"][0].get("dp", 1)
    groups.append("; ".join(f"{d} dp {dp} x {len(t)} x tp {t[0]}" for d, t in kinds.items()))
idle = f"{a - used.get('A100-40GB', 0)} / {v - used.get('V100-32GB', 0)}"
speedup = f"{float(bf16) / step:.2f}x" if bf16 else "-"
print(f"{' + '.join(groups)} | {step:.1f} | {speedup} | {100 * v_blocks / blocks:.0f}% | {idle} | "
      f"{end - start:.1f} |{step}")
PY
)
      echo "| $m | $a A100-40GB + $v V100-32GB | $dt | ${row%|*}|" >>"$out/fp16.md"
      [ "$dt" = bf16 ] && bf16_step=${row##*|}
      tail -1 "$out/fp16.md"
    done
  done
done
