#!/usr/bin/env bash
# Schedules bench (issue 29): every shipped GPU cluster of at most 32 GPUs (CLUSTERS; the
# 64-GPU ones have more GPUs than these models have layers) with each model (MODELS, default
# gpt-1.3b, gpt-13b, llama2-7b, llama3-8b; estimated profiles, the cluster's devices, memory,
# links and micro-batches, the model split evenly), planned by Ballast's method under 1F1B and
# under each other schedule at the same memory limits, side by side:
#   - step (simulated) and its ratio to 1F1B's, bubble (the GPUs' idle share of the step);
#   - the recompute each needs (ms per micro-batch over all stages) and the layers it
#     recomputes (whole or in part), the most micro-batches a stage holds;
#   - with host memory (HOST_GIB per GPU, default 64) and --actions recompute,offload, what
#     1F1B offloads instead (the new schedules run recompute only: docs/schedules.md).
# Every plan with --repartition: 1F1B's and GPipe's own search, the others on 1F1B's order and
# split or the even split, the faster; each search stops after TIME_LIMIT seconds (default 5)
# or its 10000 nodes. Writes OUT_DIR/schedules.md.
# Usage: bench/schedules.sh BALLAST OUT_DIR
set -euo pipefail
ballast=${1:?usage: bench/schedules.sh BALLAST OUT_DIR}
out=${2:?usage: bench/schedules.sh BALLAST OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
models=${MODELS:-"gpt-1.3b gpt-13b llama2-7b llama3-8b"}
host_gib=${HOST_GIB:-64}
clusters=${CLUSTERS:-"t4-4090-4 v100-a100-8 llama2-7b-h100-a100-8 llama2-7b-h100-a100-8-dp2
  a10-l4-v100-16 h100-a100-l4-16 llama3-8b-h100-h200-16 a100-h100-h200-32
  llama2-70b-a100-h100-h200-32"}
schedules="1f1b gpipe zb-h1 v-half interleaved:2 interleaved:4 auto"
time_limit=${TIME_LIMIT:-5}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
md=$out/schedules.md
{
  echo "# Schedules side by side: 1F1B against interleaved, ZB-H1 and V-Half"
  echo
  echo "Each shipped GPU cluster of at most 32 GPUs (its devices, memory limits, links, reserve,"
  echo "groups and micro-batches; the 64-GPU ones have more GPUs than these models have layers)"
  echo "with each model on estimated profiles, the model split evenly over the GPUs, planned by"
  echo "\`ballast plan --method optimal --repartition\` under every schedule: 1F1B's and GPipe's"
  echo "own search, the other schedules on the order and split it finds for 1F1B (a GPU's"
  echo "chunks splitting its layers) or on the even split, the faster. Made by"
  echo "\`bench/schedules.sh build/ballast bench/results\`."
  echo
  echo "step: simulated ms; vs 1F1B: its step over 1F1B's (below 1 is faster); bubble: the"
  echo "GPUs' idle share of the step; recompute: ms per micro-batch over all stages; layers:"
  echo "recomputed whole or in part; v max: the most micro-batches any stage holds; memory: the"
  echo "fullest GPU's planned bytes over its limit. offload (1F1B with ${host_gib} GiB of host"
  echo "memory a GPU, --actions recompute,offload): its step and the layers it offloads; the"
  echo "new schedules plan recompute only. A dash: no plan fits the memory; n/a: more GPUs, or"
  echo "more chunks, than the model has layers (a GPU holds a layer a chunk at least)."
  echo
} >"$md"
for c in $clusters; do
  src=$root/configs/clusters/$c.json
  for m in $models; do
    python3 - "$src" "$tmp" "$m" "$ballast" "$root" "$host_gib" >"$tmp/cluster.log" 2>&1 <<'PY' || { echo "$c $m: $(tail -1 "$tmp/cluster.log")" >&2; continue; }
import json, os, subprocess, sys
src, tmp, model, ballast, root, host_gib = sys.argv[1:7]
c = json.load(open(src))
made = {}
for st in c["stages"]:
    d = st["device"]
    if d not in made:
        made[d] = os.path.join(tmp, f"{model}-{d}.json")
        if not os.path.exists(made[d]):
            subprocess.run([ballast, "profile", "--model", f"{root}/configs/models/{model}.json",
                            "--estimate", "--device", d, "-o", made[d]], check=True,
                           stdout=subprocess.DEVNULL)
    st["profile"] = made[d]
    st.pop("layers", None)
json.dump(c, open(os.path.join(tmp, "c.json"), "w"))
for st in c["stages"]:
    st["host_memory_bytes"] = int(host_gib) << 30
json.dump(c, open(os.path.join(tmp, "c-host.json"), "w"))
PY
    echo "## $c, $m" >>"$md"
    echo >>"$md"
    echo "| schedule | step ms | vs 1F1B | bubble | recompute ms | layers | v max | memory | offload (1F1B) |" >>"$md"
    echo "|---|---:|---:|---:|---:|---:|---:|---:|---|" >>"$md"
    one=
    for s in $schedules; do
      name=${s%%:*} v=${s#*:}
      flags="--schedule $name"
      [ "$v" != "$s" ] && flags="$flags --virtual-stages $v"
      rc=0
      "$ballast" plan --cluster "$tmp/c.json" --method optimal --repartition $flags --quiet \
        --time-limit "$time_limit" \
        -o "$tmp/p.json" >"$tmp/p.log" 2>&1 || rc=$?
      off="n/a"
      if [ "$name" = 1f1b ]; then
        orc=0
        "$ballast" plan --cluster "$tmp/c-host.json" --method optimal --repartition --schedule 1f1b \
          --time-limit "$time_limit" \
          --actions recompute,offload --quiet -o "$tmp/o.json" >"$tmp/o.log" 2>&1 || orc=$?
        off="-"
        [ "$orc" = 0 ] && off=$(python3 -c "
import json; p = json.load(open('$tmp/o.json'))
n = sum(len(s.get('offload', [])) + len(s.get('offload_options', [])) for s in p['stages'])
print(f\"{p['iteration_ms']:.1f} ms, {n} layers\")")
      fi
      if [ "$rc" != 0 ]; then
        why=-
        if [ "$rc" = 2 ]; then
          why="n/a: refused"
          grep -q "is more than the model's" "$tmp/p.log" && why="n/a: more chunks than layers"
          grep -q "but the model has only" "$tmp/p.log" && why="n/a: more GPUs than layers"
        fi
        echo "| $s | $why | | | | | | | $off |" >>"$md"
        continue
      fi
      "$ballast" simulate --plan "$tmp/p.json" -o "$tmp/sim.json" >/dev/null
      python3 - "$tmp/p.json" "$tmp/sim.json" "${one:-}" "$name" "$off" >>"$md" <<'PY'
import json, sys
p, r = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
one = float(sys.argv[3]) if sys.argv[3] else p["iteration_ms"]
rec = sum(st["recompute_ms"] for st in p["stages"])
layers = sum(len(st["recompute"]) + len(st.get("recompute_options", [])) for st in p["stages"])
mem = max(st["memory_bytes"] / st["memory_limit_bytes"] for st in p["stages"])
name = p["schedule"] + (f" v={p['virtual_stages']}" if p.get("virtual_stages", 1) > 1 else "")
if sys.argv[4] == "auto":
    name = "auto: " + name
print(f"| {name} | {p['iteration_ms']:.1f} | {p['iteration_ms'] / one:.3f} | "
      f"{100 * r['bubble_fraction']:.1f}% | {rec:.2f} | {layers} | "
      f"{max(st['in_flight'] for st in p['stages'])} | {100 * mem:.0f}% | {sys.argv[5]} |")
PY
      [ -z "$one" ] && one=$(python3 -c "import json; print(json.load(open('$tmp/p.json'))['iteration_ms'])")
    done
    echo >>"$md"
  done
done
