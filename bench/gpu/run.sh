#!/usr/bin/env bash
# Ballast's CUDA runtime against PyTorch on one GPU: tokens/s and MFU of the GPT-2-124M- and
# 350M-sized models (configs/models/gpt-125m.json, gpt-350m.json), fp32 and bf16, without and
# with full recomputation (Ballast: a one-stage `--method full` plan; PyTorch:
# torch.utils.checkpoint around every block), PyTorch eager and torch.compile, all in one run:
# every configuration REPEATS times, the systems alternating, medians (min-max) and ratios.
#
# MFU = model FLOPs per step / (step time x the GPU's dense peak from configs/devices.json:
# peak_tflops_16bit for bf16, peak_tflops_fp16 for fp16, peak_tflops_fp32 for fp32); "unknown"
# when the GPU (or its fp16 peak) is not in the table. Model FLOPs per token (PaLM's and llm.c's
# count, the same for every system and not counting recomputation): 6 x (weights multiplied by:
# the blocks' four matrices and the output projection) + 12 x n_layer x n_embd x seq_len
# (attention scores and their product with v).
#
# usage: bench/gpu/run.sh [BUILD]       (default build; BUILD/ballast is used)
#   MODELS="configs/models/gpt-125m.json configs/models/gpt-350m.json"  DTYPES="fp32 bf16"
#   REPEATS=3  STEPS=8  MICRO_BATCHES=4  PYTHON=python3  OUT=bench/results
# writes OUT/gpu-DEVICE-vs-torch.md and OUT/gpu-DEVICE-vs-torch.jsonl (every sample).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
ballast=$build/ballast
models=${MODELS:-configs/models/gpt-125m.json configs/models/gpt-350m.json}
dtypes=${DTYPES:-fp32 bf16}
repeats=${REPEATS:-3}
steps=${STEPS:-8}
mb=${MICRO_BATCHES:-4}
py=${PYTHON:-python3}
out=${OUT:-bench/results}
[ -x "$ballast" ] || { echo "no $ballast: build first (bench/gpu/README.md)"; exit 2; }
"$py" -c "import torch; assert torch.cuda.is_available()" ||
  { echo "needs PyTorch with CUDA ($py)"; exit 2; }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
device=$("$py" bench/gpu/device_name.py "$gpu")
echo "GPU: $gpu (device table: $device)"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tag=$(echo "$device" | tr -c 'A-Za-z0-9.\n-' '-')
samples="$out/gpu-$tag-vs-torch.jsonl"
mkdir -p "$out"
: > "$samples"

for model in $models; do
  name=$(basename "$model" .json)
  for dt in $dtypes; do
    # the model in this dtype, an estimated profile (plans need one; its times are not used
    # here), a one-stage cluster with the GPU's memory, and the two plans
    "$py" -c "import json,sys; m=json.load(open(sys.argv[1])); m['dtype']=sys.argv[2]; \
      m.pop('name',None); m.pop('description',None); json.dump(m,open(sys.argv[3],'w'))" \
      "$model" "$dt" "$work/$name-$dt.json"
    profile_device=$device; [ "$device" = unknown ] && profile_device=H100-80GB
    "$ballast" profile --model "$work/$name-$dt.json" --estimate --device "$profile_device" \
      -o "$work/$name-$dt-prof.json"
    mem=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    cat > "$work/$name-$dt-cluster.json" << JSON
{"format": "ballast-cluster/1", "schedule": "1f1b", "micro_batches": $mb,
 "stages": [{"device": "$profile_device", "memory_bytes": $((mem * 1048576)),
             "profile": "$name-$dt-prof.json"}]}
JSON
    for rec in none full; do
      "$ballast" plan --cluster "$work/$name-$dt-cluster.json" --method $rec --quiet \
        -o "$work/$name-$dt-$rec.json"
    done
    for r in $(seq "$repeats"); do
      for rec in none full; do
        flag=""; [ $rec = full ] && flag=--recompute
        order="ballast eager compile"; [ $((r % 2)) -eq 0 ] && order="compile eager ballast"
        for sys in $order; do
          if [ $sys = ballast ]; then
            "$ballast" train --plan "$work/$name-$dt-$rec.json" --steps "$steps" --device cuda \
              --quiet --metrics "$work/m.json" > /dev/null
            "$py" -c "import json,sys; m=json.load(open(sys.argv[1])); \
              print(json.dumps({'tokens_per_s': m['tokens_per_s'], \
              'peak_bytes': m['stages'][0]['peak_bytes'], \
              'device_used_bytes': m['stages'][0]['cuda']['device_used_end_bytes']}))" \
              "$work/m.json" > "$work/r.json"
          else
            comp=""; [ $sys = compile ] && comp=--compile
            "$py" bench/gpu/torch_gpt_cuda.py "$work/$name-$dt.json" --micro-batches "$mb" \
              --steps "$steps" --dtype "$dt" $comp $flag > "$work/r.json"
          fi
          "$py" -c "import json,sys; r=json.load(open(sys.argv[1])); \
            r.update(model=sys.argv[2], dtype=sys.argv[3], recompute=sys.argv[4], system=sys.argv[5]); \
            print(json.dumps(r))" "$work/r.json" "$name" "$dt" "$rec" "$sys" | tee -a "$samples"
        done
      done
    done
  done
done

"$py" bench/gpu/report.py vs-torch "$samples" "$out/gpu-$tag-vs-torch.md" "$gpu" "$device" \
  "$mb" "$steps" "$repeats" $models
