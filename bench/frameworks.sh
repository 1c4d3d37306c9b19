#!/usr/bin/env bash
# Frameworks bench (issue 24): on every shipped mixed cluster, the simulated step of the best
# plan (--repartition) for each target: Ballast's own runtime, Megatron-LM per rank and on its
# command line alone, NeMo per rank and on its command line, ColossalAI, FlagScale; and a plan
# made for Ballast run as Megatron-LM runs it (`ballast export --to megatron`, whose note gives
# the framework's step on the same split). Clusters with a GPU below compute capability 8.0
# (V100, T4: no bf16 tensor cores) are planned in fp16, their profiles estimated again; the
# frameworks' activation models assume flash attention there, which those GPUs cannot run, so
# those cells read "refused". Also the issue's own cluster: 8 A100-40GB + 8 V100-32GB, Llama-2
# 7B at 4096 tokens, 512 micro-batches of 1. Each target's activation model is its own
# (profile --for), so steps compare the settings each framework can say, not one model.
# Writes frameworks.md (the table), frameworks.dat and frameworks.png (gnuplot, if present).
# Usage: bench/frameworks.sh BALLAST OUT_DIR
set -euo pipefail
ballast=${1:?usage: bench/frameworks.sh BALLAST OUT_DIR}
out=${2:?usage: bench/frameworks.sh BALLAST OUT_DIR}
root=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
clusters="llama2-7b-h100-a100-8 llama3-8b-h100-h200-16 h100-a100-l4-16 a100-h100-h200-32
  llama2-70b-a100-h100-h200-32 four-kinds-64 mixed-64 v100-a100-8 a10-l4-v100-16 t4-4090-4"
targets="ballast megatron megatron-cli nemo nemo-cli colossalai flagscale"

# The cluster as planned here: paths absolute; in fp16 with profiles estimated again where a
# device has no bf16 tensor cores. Prints its label.
prepare() {
  python3 - "$root" "$1" "$2" "$ballast" "$tmp" <<'PY'
import json, os, subprocess, sys
root, src, dst, ballast, tmp = sys.argv[1:]
devices = {d["name"]: d for d in json.load(open(os.path.join(root, "configs/devices.json")))["devices"]}
c = json.load(open(src))
base = os.path.dirname(src)
model_name = c["stages"][0]["profile"].split("/")[-2]
model = json.load(open(os.path.join(root, "configs/models", model_name + ".json")))
old = any(not devices.get(s["device"], {}).get("bf16_tensor", True) for s in c["stages"])
label = os.path.basename(src)[:-5]
if old and model.get("dtype") == "bf16":
    model["dtype"] = "fp16"
    mfile = os.path.join(tmp, label + ".fp16.model.json")
    json.dump(model, open(mfile, "w"))
    for d in sorted({s["device"] for s in c["stages"]}):
        prof = os.path.join(tmp, "%s.%s.json" % (label, d))
        if not os.path.exists(prof):
            subprocess.run([ballast, "profile", "--model", mfile, "--estimate", "--device", d,
                            "-o", prof], check=True, stdout=subprocess.DEVNULL)
    for s in c["stages"]:
        s["profile"] = os.path.join(tmp, "%s.%s.json" % (label, s["device"]))
    label += " (fp16)"
else:
    for s in c["stages"]:
        s["profile"] = os.path.join(base, s["profile"])
json.dump(c, open(dst, "w"))
print(label)
PY
}

# The issue's cluster: 8 A100-40GB then 8 V100-32GB, Llama-2 7B in fp16, 512 micro-batches.
issue_cluster() {
  python3 - "$root" "$1" "$ballast" "$tmp" <<'PY'
import json, os, subprocess, sys
root, dst, ballast, tmp = sys.argv[1:]
model = json.load(open(os.path.join(root, "configs/models/llama2-7b.json")))
model["dtype"] = "fp16"
mfile = os.path.join(tmp, "issue.model.json")
json.dump(model, open(mfile, "w"))
stages = []
for d, mem in (("A100-40GB", 42505273344), ("V100-32GB", 34089730048)):
    prof = os.path.join(tmp, "issue.%s.json" % d)
    subprocess.run([ballast, "profile", "--model", mfile, "--estimate", "--device", d, "-o", prof],
                   check=True, stdout=subprocess.DEVNULL)
    stages += [{"device": d, "memory_bytes": mem, "profile": prof} for _ in range(8)]
json.dump({"format": "ballast-cluster/1", "schedule": "1f1b", "micro_batches": 512,
           "reserve_bytes": 2147483648, "link": {"gbps": 100, "latency_us": 5},
           "stages": stages}, open(dst, "w"))
PY
}

# One cell: the step of `plan --for T [--repartition]`, or why there is none.
cell() {
  local cluster=$1 target=$2 plan=$3 search=$4
  if "$ballast" plan --quiet --cluster "$cluster" --for "$target" $search -o "$plan" \
      2>"$tmp/err"; then
    python3 -c "import json,sys; print('%.1f' % json.load(open(sys.argv[1]))['iteration_ms'])" "$plan"
  elif grep -q "compute capability below 8.0" "$tmp/err"; then
    echo "refused"
  elif grep -q "cannot run this split" "$tmp/err"; then
    echo "split"
  else
    echo "no-fit"
  fi
}

# A plan made for Ballast as framework T runs it: the note's step, the plan's own when it
# exports as it is, or why not.
as_run() {
  local plan=$1 target=$2
  if ! "$ballast" export --plan "$plan" --to "$target" -o "$tmp/launch" --stages "$tmp/st.py" \
      2>"$tmp/note"; then
    if grep -q "compute capability below 8.0" "$tmp/note"; then echo refused
    elif grep -q "cannot run the plan's split" "$tmp/note"; then echo split
    else echo no-fit; fi
    return
  fi
  python3 - "$plan" "$tmp/note" <<'PY'
import json, re, sys
m = re.search(r"runs it ([0-9.]+) ms", open(sys.argv[2]).read())
print("%.1f" % (float(m.group(1)) if m else json.load(open(sys.argv[1]))["iteration_ms"]))
PY
}

ratio() {
  python3 -c "import sys
a, b = sys.argv[1], sys.argv[2]
try: print('%.2f' % (float(a) / float(b)))
except ValueError: print('-')" "$1" "$2"
}

{
  echo "# Frameworks bench: simulated step (ms) of the best plan (--repartition) each target can run"
  echo
  echo "Each target on its own activation model (\`profile --for\`); \"Ballast in Megatron-LM\": the"
  echo "\`--for ballast\` plan exported \`--to megatron\`, the step Megatron-LM's best settings on that"
  echo "split give. \"refused\": the frameworks' activation models assume flash attention, which a"
  echo "GPU below compute capability 8.0 (V100, T4) cannot run. The last two columns: what"
  echo "per-stage settings buy, the command line's step over the per-rank one."
  echo
  echo "| cluster | ballast | megatron | megatron-cli | nemo | nemo-cli | colossalai | flagscale | Ballast in Megatron-LM | Megatron cli/per-rank | NeMo cli/per-rank |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
} >"$out/frameworks.md"
echo "# cluster ballast megatron megatron-cli nemo nemo-cli colossalai flagscale ballast-in-megatron (NaN: refused or no fit)" \
  >"$out/frameworks.dat"
names="$clusters issue24-a100-40gb-v100-16"
for name in $names; do
  if [ "$name" = issue24-a100-40gb-v100-16 ]; then
    issue_cluster "$tmp/$name.json"
    label="issue 24: 8 A100-40GB + 8 V100-32GB, Llama-2 7B (fp16)"
  else
    label=$(prepare "$root/configs/clusters/$name.json" "$tmp/$name.json")
  fi
  declare -A step=()
  for t in $targets; do
    step[$t]=$(cell "$tmp/$name.json" "$t" "$tmp/$name.$t.plan.json" --repartition)
  done
  declare -A own=()
  for t in ballast megatron megatron-cli nemo nemo-cli; do
    own[$t]=$(cell "$tmp/$name.json" "$t" "$tmp/$name.$t.own.json" "")
  done
  for t in megatron megatron-cli; do
    own[in-$t]=-
    [ -f "$tmp/$name.ballast.own.json" ] && own[in-$t]=$(as_run "$tmp/$name.ballast.own.json" "$t")
  done
  echo "| $label | ${own[ballast]} | ${own[megatron]} | ${own[megatron-cli]} | $(ratio "${own[megatron-cli]}" "${own[megatron]}") | ${own[nemo]} | ${own[nemo-cli]} | ${own[in-megatron]} | ${own[in-megatron-cli]} |" \
    >>"$tmp/own.md"
  unset own
  in_megatron=-
  if [ -f "$tmp/$name.ballast.plan.json" ]; then
    in_megatron=$(as_run "$tmp/$name.ballast.plan.json" megatron)
  fi
  md="| $label"
  dat=$name
  [[ "$label" == *fp16* ]] && dat="$name-fp16"
  for t in $targets; do
    md="$md | ${step[$t]}"
    v=${step[$t]}
    [[ "$v" =~ ^[0-9.]+$ ]] || v=NaN
    dat="$dat $v"
  done
  v=$in_megatron
  [[ "$v" =~ ^[0-9.]+$ ]] || v=NaN
  echo "$dat $v" >>"$out/frameworks.dat"
  echo "$md | $in_megatron | $(ratio "${step[megatron-cli]}" "${step[megatron]}") | $(ratio "${step[nemo-cli]}" "${step[nemo]}") |" \
    >>"$out/frameworks.md"
  unset step
done
{
  echo
  echo "## On the cluster's own split (no --repartition): what per-stage settings buy"
  echo
  echo "\"split\": the framework cannot run the cluster's split (NeMo's stages between the first and"
  echo "the last must hold alike). \"Ballast in Megatron-LM\": the --for ballast plan of that split as"
  echo "Megatron-LM runs it, per rank and on its command line."
  echo
  echo "| cluster | ballast | megatron | megatron-cli | cli/per-rank | nemo | nemo-cli | Ballast in Megatron-LM | Ballast in Megatron-LM (cli) |"
  echo "|---|---|---|---|---|---|---|---|---|"
  cat "$tmp/own.md"
} >>"$out/frameworks.md"
cat >"$out/frameworks.gp" <<'GP'
set terminal pngcairo size 1300,620 noenhanced
set output "frameworks.png"
set bmargin 12
set title "Best plan's simulated step for each target (missing bars: refused or no fit)"
set style data histograms
set style histogram clustered gap 1
set style fill solid 0.8 border -1
set logscale y
set ylabel "step ms (log)"
set xtics rotate by 40 right font ",9"
set key top left font ",9"
plot "frameworks.dat" using 2:xtic(1) title "ballast", "" using 3 title "megatron (per rank)", \
     "" using 4 title "megatron-cli", "" using 5 title "nemo (per rank)", "" using 6 title "nemo-cli", \
     "" using 7 title "colossalai", "" using 8 title "flagscale", "" using 9 title "Ballast plan in Megatron-LM"
GP
if command -v gnuplot >/dev/null; then (cd "$out" && gnuplot frameworks.gp); fi
cat "$out/frameworks.md"
