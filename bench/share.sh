#!/usr/bin/env bash
# Jobs time-sharing GPUs (issue 15), two parts:
#
# 1. CPU ranks: three GPT jobs of different sizes (GPT-tiny and two smaller ones) on two
#    stages, planned with `ballast plan --share` and trained with `train --share`, once with
#    the persistent/temporary split (a switch moves nothing) and once with --switch full (the
#    baseline: a job's state to host at switch-out and back at switch-in). Per mode: switches,
#    mean and largest switch time (the slowest rank), persistent bytes moved per switch, and
#    the device peaks against sum persistent + temporary.
# 2. The shipped GPU clusters: for mixes of GPT models (estimated profiles on each cluster's
#    devices, each job on the cluster's stages, split evenly), whether each job fits alone and
#    whether the mix fits with the split (every job's persistent region resident, one
#    temporary region): "split" fits with the split; "alone only" fits only without it (each
#    job alone, so only by switching everything); "no" some job does not fit even alone.
#    The cluster's own model keeps its split; models with fewer layers than stages are left
#    out.
#
# usage: bench/share.sh [BUILD_DIR [OUT_DIR]]   (defaults: build, out/share)
#        STEPS=8 SLICE=1 bench/share.sh
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-out/share}
steps=${STEPS:-8}
slice=${SLICE:-1}
ballast="$(pwd)/$build/ballast"
mkdir -p "$out"
mpi=(timeout 600 mpirun --allow-run-as-root --oversubscribe -np 2)

model() { # name n_layer n_embd n_head seq_len vocab micro_batch dtype
  printf '{"format": "ballast-model/1", "kind": "gpt", "n_layer": %s, "n_embd": %s, "n_head": %s, "seq_len": %s, "vocab_size": %s, "micro_batch": %s, "dtype": "%s"}\n' \
    "$2" "$3" "$4" "$5" "$6" "$7" "$8" > "$out/$1.json"
}

echo "== 1. three jobs on two CPU ranks: switches, share against full"
model cpu-a 2 64 2 64 256 4 fp32
model cpu-b 4 96 4 64 256 4 fp32
cp configs/models/gpt-tiny.json "$out/cpu-tiny.json"
jobs=()
for m in cpu-tiny cpu-a cpu-b; do
  "$ballast" profile --model "$out/$m.json" --estimate --device cpu -o "$out/$m.prof.json" >/dev/null
  printf '{"format": "ballast-cluster/1", "schedule": "1f1b", "micro_batches": 4, "stages": [{"device": "cpu", "memory_bytes": 134217728, "profile": "%s.prof.json"}, {"device": "cpu", "memory_bytes": 134217728, "profile": "%s.prof.json"}]}\n' \
    "$m" "$m" > "$out/job-$m.json"
  jobs+=("$out/job-$m.json")
done
"$ballast" plan --share "${jobs[@]}" --unit 1K -o "$out/share-cpu.json"
for mode in share full; do
  "${mpi[@]}" "$ballast" train --share "$out/share-cpu.json" --slice "$slice" --steps "$steps" \
    --threads 1 --quiet --switch "$mode" --metrics "$out/metrics-$mode.json"
done
python3 - "$out" <<'EOF'
import json, sys
out = sys.argv[1]
print("| switch | switches | mean ms | max ms | persistent bytes moved / switch | temporary bytes / switch | device peak / planned |")
print("|---|---|---|---|---|---|---|")
for mode in ("share", "full"):
    m = json.load(open(f"{out}/metrics-{mode}.json"))
    sw = m["switches"]
    ms = [s["ms"] for s in sw]
    moved = sum(s["persistent_bytes_moved"] for s in sw) / len(sw)
    temp = sum(s["temporary_bytes"] for s in sw) / len(sw)
    peaks = ", ".join(f'{d["peak_bytes"]}/{d["planned_bytes"]}' for d in m["devices"])
    print(f"| {mode} | {len(sw)} | {sum(ms)/len(ms):.4f} | {max(ms):.4f} | {moved:.0f} | {temp:.0f} | {peaks} |")
full = json.load(open(f"{out}/metrics-full.json"))
share = json.load(open(f"{out}/metrics-share.json"))
same = all([s["loss"] for s in a["steps"]] == [s["loss"] for s in b["steps"]]
           for a, b in zip(share["jobs"], full["jobs"]))
print(f"losses of every job identical under share and full: {same}")
EOF

echo
echo "== 2. shipped GPU clusters: which job mixes fit with the split, which only without it"
for m in gpt-125m gpt-350m gpt-1.3b gpt-13b gpt-76b; do
  [ -f "configs/models/$m.json" ] || continue
  mkdir -p "$out/gpu/$m"
done
python3 - "$out" "$ballast" <<'EOF'
import itertools, json, os, subprocess, sys
out, ballast = sys.argv[1], sys.argv[2]
models = [m for m in ("gpt-125m", "gpt-350m", "gpt-1.3b", "gpt-13b", "gpt-76b")
          if os.path.exists(f"configs/models/{m}.json")]
gpu = f"{out}/gpu"

def run(args):
    return subprocess.run([ballast] + args, capture_output=True, text=True).returncode

def profile(model, device):
    path = f"{gpu}/{model}/{device}.json"
    if not os.path.exists(path):
        rc = run(["profile", "--model", f"configs/models/{model}.json", "--estimate",
                  "--device", device, "-o", path])
        if rc != 0:
            return None
    return os.path.abspath(path)

def job(cluster_name, cluster, model):
    """The cluster's stages with `model`'s profile on each device: the cluster's own model
    keeps its split, another is split evenly (None: fewer layers than stages)."""
    c = json.loads(json.dumps(cluster))
    c.pop("name", None); c.pop("description", None)
    n_layer = json.load(open(f"configs/models/{model}.json"))["n_layer"]
    if n_layer + 2 < len(c["stages"]):
        return None
    for s in c["stages"]:
        own = f"/{model}/" in s["profile"]
        p = profile(model, s["device"])
        if p is None:
            return None
        s["profile"] = p
        if not own:
            s.pop("layers", None)
    path = f"{gpu}/{cluster_name}-{model}.json"
    json.dump(c, open(path, "w"))
    return path

print("| cluster | mix | each alone | with the split |")
print("|---|---|---|---|")
for f in sorted(os.listdir("configs/clusters")):
    if not f.endswith(".json") or f.startswith("cpu"):
        continue
    name = f[:-5]
    cluster = json.load(open(f"configs/clusters/{f}"))
    jobs = {m: job(name, cluster, m) for m in models}
    jobs = {m: p for m, p in jobs.items() if p is not None}
    alone = {m: run(["plan", "--cluster", p, "--quiet"]) for m, p in jobs.items()}
    mixes = list(itertools.combinations_with_replacement(sorted(jobs, key=models.index), 2))
    mixes += [tuple(sorted(jobs, key=models.index)[:3])] if len(jobs) >= 3 else []
    for mix in mixes:
        each = all(alone[m] == 0 for m in mix)
        rc = run(["plan", "--share"] + [jobs[m] for m in mix] + ["--quiet"])
        verdict = "split" if rc == 0 else ("alone only" if each else "no")
        fits = ", ".join(f"{m} {'yes' if alone[m] == 0 else 'no'}" for m in dict.fromkeys(mix))
        print(f"| {name} | {' + '.join(mix)} | {fits} | {verdict} |")
EOF
