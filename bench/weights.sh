#!/usr/bin/env bash
# Streamed-weights bench (issue 28): on every shipped GPU cluster (its devices and
# micro-batches, the layers split evenly, each stage given HOST_GIB of host memory and its
# datasheet host link), the largest GPT of MODELS (smallest first) that `ballast plan
# --method optimal` fits with recompute, offload and the optimizer on the host, and with
# weights streamed too (--actions ...,weights), each with its simulated step (the fastest
# plan found, --min-gain 0) and, with weights, the stages that stream. Profiles are the
# estimated ones (configs/profiles/estimated, made here when a device has none).
# Writes weights.md and weights.csv (one row per cluster, model and action set).
# Usage: bench/weights.sh BALLAST OUT_DIR        (CLUSTERS=..., MODELS=..., HOST_GIB=...)
set -euo pipefail
ballast=${1:?usage: bench/weights.sh BALLAST OUT_DIR}
out=${2:?usage: bench/weights.sh BALLAST OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
host_gib=${HOST_GIB:-256}
clusters=${CLUSTERS:-"t4-4090-4 v100-a100-8 a10-l4-v100-16 h100-a100-l4-16 a100-h100-h200-32 mixed-64 four-kinds-64"}
models=${MODELS:-"gpt-1.3b gpt-13b gpt-76b gpt-175b"}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "cluster,model,actions,fits,iteration_ms,streaming_stages,plan_s" >"$out/weights.csv"

# make_cluster: the cluster with the model's estimated profiles and host memory per stage
. "$root/bench/host_clusters.sh"

for name in $clusters; do
  for model in $models; do
    make_cluster "$name" "$model" "$tmp/cluster.json"
    for actions in recompute,offload,optimizer recompute,offload,optimizer,weights; do
      t0=$(date +%s.%N)
      if "$ballast" plan --quiet --cluster "$tmp/cluster.json" --actions "$actions" --min-gain 0 \
        -o "$tmp/plan.json" 2>/dev/null; then
        t1=$(date +%s.%N)
        python3 - "$tmp/plan.json" "$name" "$model" "$actions" "$t0" "$t1" "$out" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
name, model, actions, t0, t1, out = sys.argv[2:8]
streaming = sum(1 for s in plan["stages"] if s.get("offload_weights"))
with open(out + "/weights.csv", "a") as f:
    f.write("%s,%s,%s,1,%.3f,%d,%.2f\n" % (name, model, actions.replace(",", "+"),
                                            plan["iteration_ms"], streaming,
                                            float(t1) - float(t0)))
PY
      else
        t1=$(date +%s.%N)
        echo "$name,$model,${actions//,/+},0,NaN,0,$(python3 -c "print('%.2f' % ($t1 - $t0))")" \
          >>"$out/weights.csv"
      fi
    done
  done
done

python3 - "$out" "$host_gib" "$models" <<'PY'
import csv, sys
out, gib, models = sys.argv[1], sys.argv[2], sys.argv[3].split()
rows = list(csv.DictReader(open(out + "/weights.csv")))
clusters = []
for r in rows:
    if r["cluster"] not in clusters:
        clusters.append(r["cluster"])
def largest(cluster, actions):
    fit = [r for r in rows if r["cluster"] == cluster and r["actions"] == actions and r["fits"] == "1"]
    fit.sort(key=lambda r: models.index(r["model"]))
    return fit[-1] if fit else None
def cell(r):
    if r is None:
        return "none"
    s = "%s, %.0f ms" % (r["model"], float(r["iteration_ms"]))
    return s + (" (%s stages stream)" % r["streaming_stages"] if r["streaming_stages"] != "0" else "")
with open(out + "/weights.md", "w") as f:
    f.write("# Streamed weights: the largest model each shipped cluster trains\n\n")
    f.write("GPT models (%s, bf16) on the shipped GPU clusters, layers split evenly, estimated "
            "profiles; every stage %s GiB of host memory and its device's datasheet host link. "
            "`ballast plan --method optimal --min-gain 0`, without and with `weights` in "
            "--actions: the largest model that fits, and its simulated step. Made by "
            "bench/weights.sh.\n\n" % (", ".join(models), gib))
    f.write("| cluster | recompute+offload+optimizer | ...+weights |\n|---|---|---|\n")
    for c in clusters:
        f.write("| %s | %s | %s |\n" % (c, cell(largest(c, "recompute+offload+optimizer")),
                                       cell(largest(c, "recompute+offload+optimizer+weights"))))
    f.write("\nA small model that does not fit a cluster of 32 or 64 stages has fewer layers than "
            "the cluster has stages (GPT-1.3B 26, GPT-13B 42).\n")
    f.write("\nEvery case (fits, simulated ms, stages streaming, planning seconds):\n\n")
    f.write("| cluster | model | without | with weights |\n|---|---|---|---|\n")
    for c in clusters:
        for m in models:
            by = {r["actions"]: r for r in rows if r["cluster"] == c and r["model"] == m}
            def one(a):
                r = by.get(a)
                if r is None:
                    return "-"
                if r["fits"] != "1":
                    return "no fit (%s s)" % r["plan_s"]
                return "%.0f ms, %s streaming (%s s)" % (float(r["iteration_ms"]),
                                                         r["streaming_stages"], r["plan_s"])
            f.write("| %s | %s | %s | %s |\n" % (c, m, one("recompute+offload+optimizer"),
                                                 one("recompute+offload+optimizer+weights")))
PY
cat "$out/weights.md"
