#!/usr/bin/env bash
# Host-optimizer bench (issue 13): GPT-76B and GPT-175B on every shipped GPU cluster (its
# devices and micro-batches, the layers split evenly), each stage given HOST_GIB of host memory
# (default 256: a 2 TB node shared by 8 GPUs) and its datasheet host link. Which methods fit
# without the host optimizer (none, full, uniform-min, patent, optimal with recompute, and with
# recompute,offload) and with it (optimal with recompute,optimizer and
# recompute,offload,optimizer, and each with optimizer-fraction: a stage's last layers only),
# their simulated iteration times (optimal's the fastest plan found, --min-gain 0, so that a
# small gain an action buys shows), and for the stages that use
# it the step's breakdown: forward, backward, recompute, gradients down, CPU update, parameters
# up, and the tail the step adds after the stage's last backward. Profiles are the estimated
# ones (configs/profiles/estimated, made here when a device has none): the host's AdamW at
# devices.json's assumed host memory bandwidth.
# Writes host_optimizer.md, host_optimizer.csv (one row per case and method) and
# host_optimizer_stages.csv (one row per stage that hosts its optimizer).
# Usage: bench/host_optimizer.sh BALLAST OUT_DIR
set -euo pipefail
ballast=${1:?usage: bench/host_optimizer.sh BALLAST OUT_DIR}
out=${2:?usage: bench/host_optimizer.sh BALLAST OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
host_gib=${HOST_GIB:-256}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
clusters="t4-4090-4 v100-a100-8 a10-l4-v100-16 h100-a100-l4-16 a100-h100-h200-32 mixed-64 four-kinds-64"
models="gpt-76b gpt-175b"
# label|method|actions
runs="none|none|recompute full|full|recompute uniform-min|uniform-min|recompute patent|patent|recompute
optimal|optimal|recompute optimal+offload|optimal|recompute,offload
optimal+optimizer|optimal|recompute,optimizer optimal+offload+optimizer|optimal|recompute,offload,optimizer
optimal+fraction|optimal|recompute,optimizer-fraction
optimal+offload+fraction|optimal|recompute,offload,optimizer-fraction"
echo "cluster,model,run,fits,iteration_ms,host_stages" >"$out/host_optimizer.csv"
echo "cluster,model,run,stage,device,layers,fwd_ms,bwd_ms,recompute_ms,grad_copy_ms,host_optimizer_ms,param_copy_ms,step_tail_ms,memory_bytes,memory_limit_bytes,host_memory_bytes" \
  >"$out/host_optimizer_stages.csv"

# make_cluster: the cluster with the model's estimated profiles and host memory per stage
. "$root/bench/host_clusters.sh"

for model in $models; do
  for name in $clusters; do
    make_cluster "$name" "$model" "$tmp/cluster.json"
    for run in $runs; do
      IFS='|' read -r label method actions <<<"$run"
      plan="$tmp/plan.json"
      fastest=()
      [ "$method" = optimal ] && fastest=(--min-gain 0)
      if "$ballast" plan --quiet --cluster "$tmp/cluster.json" --method "$method" \
        --actions "$actions" "${fastest[@]}" -o "$plan" 2>/dev/null; then
        "$ballast" simulate --plan "$plan" -o "$tmp/sim.json" >/dev/null
        python3 - "$plan" "$tmp/sim.json" "$name" "$model" "$label" "$out" <<'PY'
import json, sys
plan, sim = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
name, model, label, out = sys.argv[3:7]
hosted = 0
with open(out + "/host_optimizer_stages.csv", "a") as f:
    for st, ss in zip(plan["stages"], sim["stages"]):
        if st.get("optimizer") not in ("host", "split"):
            continue
        hosted += 1
        f.write("%s,%s,%s,%d,%s,%d-%d,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%d,%d,%d\n" % (
            name, model, label, st["index"], st["device"], st["layers"][0], st["layers"][1],
            ss["fwd_ms"], ss["bwd_ms"], ss["recompute_ms"], ss["grad_copy_ms"],
            ss["host_optimizer_ms"], ss["param_copy_ms"], ss.get("step_tail_ms", 0),
            st["memory_bytes"], st["memory_limit_bytes"], st.get("host_memory_bytes", 0)))
with open(out + "/host_optimizer.csv", "a") as f:
    f.write("%s,%s,%s,1,%.3f,%d\n" % (name, model, label, sim["iteration_ms"], hosted))
PY
      else
        echo "$name,$model,$label,0,NaN,0" >>"$out/host_optimizer.csv"
      fi
    done
  done
done

python3 - "$out" "$host_gib" <<'PY'
import csv, sys
out, gib = sys.argv[1], sys.argv[2]
rows = list(csv.DictReader(open(out + "/host_optimizer.csv")))
stages = list(csv.DictReader(open(out + "/host_optimizer_stages.csv")))
labels = []
for r in rows:
    if r["run"] not in labels:
        labels.append(r["run"])
cases = []
for r in rows:
    if (r["cluster"], r["model"]) not in cases:
        cases.append((r["cluster"], r["model"]))
def cell(r):
    if r["fits"] != "1":
        return "does not fit"
    s = "%.0f" % float(r["iteration_ms"])
    return s + (" (%s host)" % r["host_stages"] if r["host_stages"] != "0" else "")
with open(out + "/host_optimizer.md", "w") as f:
    f.write("# Host-optimizer bench: simulated iteration ms by method and actions\n\n")
    f.write("GPT-76B and GPT-175B (bf16, 96 blocks) on the shipped GPU clusters, layers split "
            "evenly, estimated profiles; every stage %s GiB of host memory and its device's "
            "datasheet host link (PCIe x16 at 80%%). The host's AdamW streams at devices.json's "
            "assumed host memory bandwidth (an assumption, not a measurement). \"(k host)\": k "
            "stages keep their optimizer (or, with +fraction, a fraction of it) on the host. "
            "optimal's cells are the fastest plans found (--min-gain 0). "
            "Made by bench/host_optimizer.sh.\n\n" % gib)
    f.write("| cluster | model | " + " | ".join(labels) + " |\n")
    f.write("|---|---|" + "---|" * len(labels) + "\n")
    for c in cases:
        by = {r["run"]: r for r in rows if (r["cluster"], r["model"]) == c}
        f.write("| %s | %s | " % c + " | ".join(cell(by[l]) for l in labels) + " |\n")
    fit_without = sum(1 for c in cases if any(r["fits"] == "1" for r in rows
                      if (r["cluster"], r["model"]) == c and "optimizer" not in r["run"]))
    fit_with = sum(1 for c in cases if any(r["fits"] == "1" for r in rows
                   if (r["cluster"], r["model"]) == c))
    f.write("\nCases that fit some method: %d of %d without the host optimizer, %d with it.\n\n"
            % (fit_without, len(cases), fit_with))
    f.write("## The step of the stages that host their optimizer (optimal+optimizer)\n\n")
    f.write("Per case, the stage whose step adds the longest tail after its last backward, ms "
            "over the whole iteration: forward, backward, recompute, gradients device->host, "
            "the CPU update (AdamW on the host), parameters host->device, and the tail.\n\n")
    f.write("| cluster | model | host stages | stage (device, layers) | fwd | bwd | recompute | "
            "grads down | CPU update | params up | tail |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
    for c in cases:
        mine = [s for s in stages if (s["cluster"], s["model"]) == c and s["run"] == "optimal+optimizer"]
        if not mine:
            continue
        w = max(mine, key=lambda s: float(s["step_tail_ms"]))
        f.write("| %s | %s | %d | %s (%s, %s) | %s | %s | %s | %s | %s | %s | %s |\n" % (
            c[0], c[1], len(mine), w["stage"], w["device"], w["layers"], w["fwd_ms"], w["bwd_ms"],
            w["recompute_ms"], w["grad_copy_ms"], w["host_optimizer_ms"], w["param_copy_ms"],
            w["step_tail_ms"]))
PY
echo "wrote $out/host_optimizer.md"
