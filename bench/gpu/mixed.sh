#!/usr/bin/env bash
# A mixed cluster emulated on one GPU: 4 ranks of `ballast train` share it, each held to the
# memory limit its stage has in the plan. Stages 0 and 1 play small GPUs (SMALL x what they
# need with nothing recomputed), stages 2 and 3 large ones (LARGE x): Ballast's optimal plan
# recomputes on the small ones only, and each stage's measured peak is set against its plan.
# For reference the same cluster runs with full recomputation. With MPS=1 (and
# nvidia-cuda-mps-control present) the ranks also run under MPS with per-rank thread
# percentages MPS_PERCENT (small GPUs get fewer SMs).
#
# Step time: measured (the median step after the first) against the plan's iteration_ms, which
# gives each stage a GPU of its own, and against every stage's compute in turn (micro-batches x
# the sum of stage_ms): what one GPU doing all four stages' work would take at best.
# PROFILE: a measured profile of MODEL (its device name goes in the cluster) for planned times
# from this GPU; default an estimate for the GPU's entry in the device table.
#
# usage: bench/gpu/mixed.sh [BUILD]
#   MODEL=configs/models/gpt-350m.json  PROFILE=""  DTYPE=bf16  MICRO_BATCHES=8  STEPS=6
#   SMALL=0.6  LARGE=2.0  MPS=0  MPS_PERCENT="30 30 70 70"  PYTHON=python3  OUT=bench/results
# writes OUT/gpu-DEVICE-mixed.md and .jsonl
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
ballast=$(readlink -f "$build/ballast")
model=${MODEL:-configs/models/gpt-350m.json}
dtype=${DTYPE:-bf16}
mb=${MICRO_BATCHES:-8}
steps=${STEPS:-6}
small=${SMALL:-0.6}
large=${LARGE:-2.0}
use_mps=${MPS:-0}
mps_percent=(${MPS_PERCENT:-30 30 70 70})
py=${PYTHON:-python3}
out=${OUT:-bench/results}
[ -x "$ballast" ] || { echo "no $ballast: build first (bench/gpu/README.md)"; exit 2; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
device=$("$py" bench/gpu/device_name.py "$gpu")
profile_device=$device; [ "$device" = unknown ] && profile_device=H100-80GB
if [ -n "${PROFILE:-}" ]; then
  profile_device=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['device']['name'])" \
    "$PROFILE")
fi
tag=$(echo "$device" | tr -c 'A-Za-z0-9.\n-' '-')
work=$(mktemp -d)
mps_dir=""
cleanup() {
  if [ -n "$mps_dir" ]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$mps_dir/pipe" nvidia-cuda-mps-control || true
  fi
  rm -rf "$work"
}
trap cleanup EXIT
mkdir -p "$out"
samples="$out/gpu-$tag-mixed.jsonl"
: > "$samples"
name=$(basename "$model" .json)

"$py" -c "import json,sys; m=json.load(open(sys.argv[1])); m['dtype']=sys.argv[2]; \
  m.pop('name',None); m.pop('description',None); json.dump(m,open(sys.argv[3],'w'))" \
  "$model" "$dtype" "$work/model.json"
if [ -n "${PROFILE:-}" ]; then
  cp "$PROFILE" "$work/prof.json"
else
  "$ballast" profile --model "$work/model.json" --estimate --device "$profile_device" \
    -o "$work/prof.json"
fi
cluster() { # cluster.json with the given four limits in bytes
  "$py" - "$work/$1" "$mb" "$profile_device" "${@:2}" << 'PY'
import json, sys
path, mb, dev, limits = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4:]
json.dump({"format": "ballast-cluster/1", "schedule": "1f1b", "micro_batches": mb,
           "stages": [{"device": dev, "memory_bytes": int(float(l)), "profile": "prof.json"}
                      for l in limits]}, open(path, "w"))
PY
}
# what each stage needs keeping everything, each stage given the whole device (a limit
# beyond the device's memory is refused)
whole=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['device']['memory_bytes'])" \
  "$work/prof.json")
cluster roomy.json "$whole" "$whole" "$whole" "$whole"
"$ballast" plan --cluster "$work/roomy.json" --method none --quiet -o "$work/roomy-plan.json"
limits=$("$py" -c "import json,sys; p=json.load(open(sys.argv[1])); f=[float(x) for x in sys.argv[2:]]; \
  print(' '.join(str(int(s['memory_bytes']*f[i])) for i,s in enumerate(p['stages'])))" \
  "$work/roomy-plan.json" "$small" "$small" "$large" "$large")
echo "emulated limits (bytes): $limits"
cluster mixed.json $limits
total=$("$py" -c "import sys; print(sum(int(x) for x in sys.argv[1:]))" $limits)
free=$(nvidia-smi --query-gpu=memory.free --format=csv,noheader,nounits | head -1)
[ "$total" -lt $((free * 1048576)) ] ||
  { echo "the four limits ($total bytes) exceed the GPU's free memory; lower LARGE"; exit 2; }

launcher="$work/rank.sh" # per-rank MPS share
cat > "$launcher" << 'SH'
#!/usr/bin/env bash
pcts=($MPS_PERCENTS)
[ -n "${MPS_PERCENTS:-}" ] && export CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=${pcts[$OMPI_COMM_WORLD_RANK]}
exec "$@"
SH
chmod +x "$launcher"
modes="off"
if [ "$use_mps" = 1 ]; then
  if command -v nvidia-cuda-mps-control > /dev/null; then
    mps_dir="$work/mps"
    mkdir -p "$mps_dir/pipe" "$mps_dir/log"
    export CUDA_MPS_PIPE_DIRECTORY="$mps_dir/pipe" CUDA_MPS_LOG_DIRECTORY="$mps_dir/log"
    nvidia-cuda-mps-control -d && modes="off on" || echo "MPS did not start: without it"
  else
    echo "no nvidia-cuda-mps-control here: without MPS"
  fi
fi

for method in optimal full; do
  "$ballast" plan --cluster "$work/mixed.json" --method $method --quiet -o "$work/$method.json"
  for mps in $modes; do
    pcts=""; [ "$mps" = on ] && pcts="${mps_percent[*]}"
    env_mps=""; [ "$mps" = off ] && env_mps="env -u CUDA_MPS_PIPE_DIRECTORY"
    MPS_PERCENTS="$pcts" $env_mps mpirun --allow-run-as-root --oversubscribe --bind-to none \
      -x MPS_PERCENTS -np 4 "$launcher" "$ballast" train --plan "$work/$method.json" \
      --steps "$steps" --quiet --metrics "$work/m.json"
    "$py" - "$work/m.json" "$work/$method.json" "$name" "$dtype" "$method" "$mps" "$pcts" \
      "$work/prof.json" \
      >> "$samples" << 'PY'
import json, sys
m, p = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
pcts = sys.argv[7].split()
stages = []
for s, ps in zip(m["stages"], p["stages"]):
    c = s.get("cuda", {})
    stages.append({"index": s["index"], "layers": "%d-%d" % tuple(ps["layers"]),
                   "recomputed": len(ps["recompute"]) + len(ps.get("recompute_options", [])),
                   "limit_bytes": ps["memory_limit_bytes"], "planned_bytes": s["planned_bytes"],
                   "peak_bytes": s["peak_bytes"], "context_bytes": c.get("context_bytes", 0),
                   "cublas_bytes": c.get("cublas_bytes", 0),
                   "mps_percent": pcts[s["index"]] if pcts else "-"})
ms = sorted(s["ms"] for s in m["steps"][1:]) or [m["steps"][0]["ms"]]
print(json.dumps({"model": sys.argv[3], "dtype": sys.argv[4], "method": sys.argv[5],
                  "mps": sys.argv[6], "tokens_per_s": m["tokens_per_s"],
                  "measured_step_ms": ms[len(ms) // 2], "planned_step_ms": p["iteration_ms"],
                  "one_gpu_ms": p["micro_batches"] * sum(s["stage_ms"] for s in p["stages"]),
                  "profile": "estimated" if json.load(open(sys.argv[8])).get("estimated") else "measured",
                  "transport": m["transport"]["kind"], "stages": stages}))
PY
  done
done
"$py" bench/gpu/report.py mixed "$samples" "$out/gpu-$tag-mixed.md" "$gpu" "$device"
