#!/usr/bin/env bash
# Every GPU check in one run of under 8 minutes, for a machine lent for minutes: each part
# under its own time limit, a part that fails or runs out never stopping the next, and the
# results saved as each part ends (OUT/log.txt, the whole output; OUT/results.tgz, every
# part's files, rewritten after each part, so what a killed run reached still comes back).
#   tests     ctest -L gpu: CUDA layers against the CPU's (fp32, bf16, fp16), training on the
#             GPU (1, 2 and 4 ranks on one GPU, recomputation bitwise, fp16 loss scaling,
#             peaks against the plan, the limit's exit 3), offload and the host optimizer on
#             CUDA, NCCL data parallelism (skipped on one GPU), profiler.torch on CUDA;
#   schedules `ballast train --device cuda` on 2 ranks of one GPU (host-staged MPI) under every
#             schedule: each one's losses, to be equal across schedules;
#   profiles  `ballast profile --device cuda:0` of GPT and Llama shapes (PROFILES), to set
#             against the estimates for the same GPU afterwards;
#   block     a Llama block's activation memory measured by PyTorch (block_memory.py), to set
#             against `ballast profile --estimate --for megatron`;
#   mixed     four ranks on one GPU with per-rank memory limits (mixed.sh);
#   torch     Ballast against PyTorch eager and torch.compile (run.sh, bf16, MODELS, REPEATS).
# usage, on the GPU machine from the tree's root, the pack carried (bench/gpu/README.md):
#   bench/gpu/all.sh OUT [PART ...]     (default every part; LIMIT_<part>=SECONDS)
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: bench/gpu/all.sh OUT [PART ...]}
shift
parts=${*:-tests schedules profiles block mixed torch}
res=/tmp/ballast-gpu/results
mkdir -p "$out" "$res"
exec > >(tee -a "$out/log.txt") 2>&1
save() { tar -czf "$out/results.tgz" -C "$(dirname "$res")" "$(basename "$res")"; }

echo "== setup $(date -u +%T)"
[ -d .dev/gpu ] || tar -C .dev -xJf .dev/gpu.tar.xz
# shellcheck disable=SC1091
source .dev/gpu/env.sh
export PMIX_MCA_pcompress_base_silence_warning=1
B=$BALLAST_BUILD/ballast
{
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  nvidia-smi | head -4
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  "$B" --version
} | tee "$res/gpu.txt"
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
device=$(python3 bench/gpu/device_name.py "$gpu")
est_device=$device; [ "$device" = unknown ] && est_device=H100-80GB
save

part_tests() {
  ctest --test-dir "$BALLAST_BUILD" -L gpu ${TESTS:+-R "$TESTS"} --output-on-failure \
    --timeout 120 > "$res/ctest.log" 2>&1
  local rc=$?
  grep -E "tests passed|Test +#|\*\*\*|Passed|Failed" "$res/ctest.log"
  return $rc
}

part_schedules() {
  local w=$res/schedules rc=0
  mkdir -p "$w"
  "$B" profile --model configs/models/gpt-tiny.json --estimate --device "$est_device" \
    -o "$w/tiny.json" || return 1
  cat > "$w/cluster.json" << JSON
{"format": "ballast-cluster/1", "schedule": "1f1b", "micro_batches": 4,
 "stages": [{"device": "$est_device", "memory_bytes": "8GiB", "profile": "tiny.json"},
            {"device": "$est_device", "memory_bytes": "8GiB", "profile": "tiny.json"}]}
JSON
  for s in 1f1b gpipe zb-h1 interleaved v-half; do
    "$B" plan --cluster "$w/cluster.json" --schedule "$s" --method full --quiet \
      -o "$w/plan-$s.json" &&
      mpirun --allow-run-as-root --oversubscribe -np 2 "$B" train --plan "$w/plan-$s.json" \
        --device cuda --steps 4 --quiet --metrics "$w/metrics-$s.json" || rc=1
    python3 -c "import json,sys; m=json.load(open(sys.argv[1])); \
      print(sys.argv[2], [s['loss'] for s in m['steps']])" "$w/metrics-$s.json" "$s" ||
      rc=1
  done
  return $rc
}

part_profiles() {
  # MODEL[@LAYERS]:SECONDS each; a name ending in -flash is the model with flash attention
  # (the materialised T x T probabilities make a 4096-token Llama's memory scan take minutes);
  # @LAYERS keeps that many blocks (each block's times and bytes are the whole model's)
  local w=$res/profiles rc=0 m limit model layers base
  mkdir -p "$w"
  for entry in ${PROFILES:-gpt-350m:25 gpt-1.3b-fp16:35 llama2-7b-flash@4:60}; do
    m=${entry%%:*} limit=${entry##*:} layers=
    [ "${m#*@}" != "$m" ] && layers=${m#*@} m=${m%@*}
    base=${m%-flash} model=configs/models/$m.json
    if [ "$base" != "$m" ] || [ -n "$layers" ]; then
      model=$w/$m.model.json
      python3 -c "import json,sys; m=json.load(open(sys.argv[1])); m['name']=sys.argv[3]; \
        m.update({'attention': 'flash'} if sys.argv[4] == 'flash' else {}); \
        m.update({'n_layer': int(sys.argv[5])} if sys.argv[5] else {}); \
        json.dump(m, open(sys.argv[2], 'w'))" \
        "configs/models/$base.json" "$model" "$m" "$([ "$base" != "$m" ] && echo flash)" "$layers"
    fi
    echo "-- $m (limit $limit s) $(date -u +%T)"
    timeout -k 5 "$limit" "$B" profile --model "$model" --device cuda:0 --repeats 3 \
      -o "$w/$m.json" > "$w/$m.log" 2>&1 || rc=1
    tail -n 3 "$w/$m.log"
    save
  done
  return $rc
}

part_block() {
  local rc=0
  for m in llama2-7b llama3-8b; do
    python3 bench/gpu/block_memory.py "configs/models/$m.json" --dtype bf16 \
      | tee -a "$res/block_memory.jsonl" || rc=1
  done
  return $rc
}

part_mixed() { # on the profile measured on this GPU where there is one (configs/profiles/measured)
  local measured=configs/profiles/measured/gpt-350m/$est_device.json
  [ -f "$measured" ] && export PROFILE=$measured
  OUT=$res bench/gpu/mixed.sh "$BALLAST_BUILD"
}

part_torch() {
  OUT=$res DTYPES=bf16 REPEATS=${REPEATS:-3} STEPS=5 \
    MODELS=${MODELS:-configs/models/gpt-125m.json configs/models/gpt-350m.json} \
    bench/gpu/run.sh "$BALLAST_BUILD"
}

# about 8 minutes in all, the setup included
declare -A limit=([tests]=90 [schedules]=25 [profiles]=150 [block]=30 [mixed]=90 [torch]=190)
for p in $parts; do
  l=${limit[$p]:-60}
  v=LIMIT_$p; l=${!v:-$l}
  echo "== $p (limit $l s) $(date -u +%T)"
  start=$SECONDS
  export -f "part_$p" save
  export B BALLAST_BUILD res est_device out PROFILES MODELS REPEATS
  timeout -k 5 "$l" bash -c "part_$p"
  rc=$?
  echo "== $p: exit $rc after $((SECONDS - start)) s"
  echo "$p $rc $((SECONDS - start))" >> "$res/parts.txt"
  save
done
echo "== done $(date -u +%T)"
