#!/usr/bin/env bash
# Offload bench (issue 12): recompute only, offload only, and both, on every shipped mixed
# cluster, each given host memory per GPU (HOST_GIB, default 128: a DGX-class node's 1-2 TB
# shared by 8 GPUs) and its datasheet host link (devices.json's PCIe at the pinned share).
# Per cluster and action set: the simulated iteration, and per stage device and host memory
# and the host link's busy share; a table (offload.md), data (offload.dat, offload_stages.csv)
# and a plot (offload.png, by gnuplot when present).
# Usage: bench/offload.sh BALLAST OUT_DIR
set -euo pipefail
ballast=${1:?usage: bench/offload.sh BALLAST OUT_DIR}
out=${2:?usage: bench/offload.sh BALLAST OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
host_gib=${HOST_GIB:-128}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
clusters="t4-4090-4 v100-a100-8 a10-l4-v100-16 h100-a100-l4-16 a100-h100-h200-32 mixed-64 four-kinds-64"
echo "# cluster recompute_ms offload_ms both_ms (NaN: no plan fits)" >"$out/offload.dat"
echo "cluster,actions,stage,device,memory_bytes,memory_limit_bytes,host_memory_bytes,recompute_ms,copy_ms,link_busy" \
  >"$out/offload_stages.csv"
{
  echo "# Offload bench: iteration ms (simulated) by the actions the planner may take"
  echo
  echo "Each stage: ${host_gib} GiB of host memory, its device's datasheet host link (PCIe x16 at 80%)."
  echo "Plan times are wall clock of \`ballast plan\` (the process, files included)."
  echo
  echo "| cluster | recompute | offload | recompute,offload | both / recompute | offloaded tensors | plan s (both) |"
  echo "|---|---|---|---|---|---|---|"
} >"$out/offload.md"
for name in $clusters; do
  python3 - "$root/configs/clusters/$name.json" "$tmp/$name.json" "$host_gib" <<'PY'
import json, os, sys
src, dst, gib = sys.argv[1], sys.argv[2], int(sys.argv[3])
c = json.load(open(src))
for s in c["stages"]:
    s["host_memory_bytes"] = gib << 30
    s["profile"] = os.path.join(os.path.dirname(src), s["profile"])
json.dump(c, open(dst, "w"))
PY
  row="$name"
  md="| $name"
  for actions in recompute offload recompute,offload; do
    plan="$tmp/$name.$actions.plan.json"
    t0=$(date +%s.%N)
    if "$ballast" plan --quiet --cluster "$tmp/$name.json" --actions "$actions" -o "$plan" 2>/dev/null; then
      t1=$(date +%s.%N)
      "$ballast" simulate --plan "$plan" -o "$tmp/sim.json" >/dev/null
      read -r ms count < <(python3 - "$plan" "$tmp/sim.json" "$name" "$actions" "$out/offload_stages.csv" <<'PY'
import json, sys
plan, sim = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
n = 0
with open(sys.argv[5], "a") as f:
    for st, ss in zip(plan["stages"], sim["stages"]):
        busy = (ss.get("copy_out_ms", 0) + ss.get("copy_in_ms", 0)) / (2 * sim["iteration_ms"])
        n += len(st.get("offload", [])) + len(st.get("offload_options", []))
        f.write("%s,%s,%d,%s,%d,%d,%d,%.3f,%.3f,%.4f\n" % (sys.argv[3], sys.argv[4], st["index"],
                st["device"], st["memory_bytes"], st["memory_limit_bytes"],
                st.get("host_memory_bytes", 0), st["recompute_ms"], st.get("copy_ms", 0), busy))
print("%.3f %d" % (sim["iteration_ms"], n))
PY
)
      row="$row $ms"
      md="$md | $ms"
      [ "$actions" = recompute ] && base=$ms
      if [ "$actions" = recompute,offload ]; then
        md="$md | $(python3 -c "print('%.3f' % ($ms / float('$base')))") | $count | $(python3 -c "print('%.2f' % ($t1 - $t0))")"
      fi
    else
      row="$row NaN"
      md="$md | no fit"
      [ "$actions" = recompute ] && base=NaN
      [ "$actions" = recompute,offload ] && md="$md | - | - | -"
    fi
  done
  echo "$row" >>"$out/offload.dat"
  echo "$md |" >>"$out/offload.md"
done
cat >"$out/offload.gp" <<'GP'
set terminal pngcairo size 1100,500
set output "offload.png"
set title "Simulated iteration by the planner's actions (host memory per GPU, datasheet PCIe)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set ylabel "iteration ms"
set xtics rotate by -20
set key top left
plot "offload.dat" using 2:xtic(1) title "recompute", "" using 3 title "offload", "" using 4 title "recompute,offload"
GP
if command -v gnuplot >/dev/null; then (cd "$out" && gnuplot offload.gp); fi
cat "$out/offload.md"
