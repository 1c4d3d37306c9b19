#!/usr/bin/env bash
# The main job: install what is missing and build; plan Llama-2-7B on 8 A100-40GB + 8
# V100-32GB in one line; plan GPT-13B on a shipped mixed cluster with Ballast's method (checked
# with GLPK) and the published one, and simulate it (a trace for ui.perfetto.dev); run the
# bench (every method on every shipped GPU cluster and model: tables and plots in out/bench);
# then measure this machine's CPU (one thread, what each rank gets), plan GPT-tiny on as many
# stages as it has cores (at least 2; stage 0 given too little memory to keep everything, so
# it recomputes), train that plan on one MPI rank per stage, and compare planned against
# measured memory and compute per stage. Each step prints one line and writes its output to
# out/logs/; the job ends on one screen: the headline numbers and where everything is. Exit 1
# when a step fails (the end of its log is printed) or the measured memory misses the plan by
# more than 2%.
set -euo pipefail
cd "$(dirname "$0")/.."
start=$(date +%s)
source scripts/deps.sh
mkdir -p out/logs
ballast=$build/ballast

# step "what" LOG command...: one line here; the command's output in out/logs/LOG.
step() {
  local what=$1 log=out/logs/$2
  shift 2
  echo "-- $what"
  if ! "$@" > "$log" 2>&1; then
    echo "FAILED: $what; the last lines of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
}

step "estimated profiles of the shipped clusters (configs/profiles/estimated)" profiles.log \
  configs/make-profiles.sh "$ballast"
step "one line: Llama-2-7B on 8 A100-40GB + 8 V100-32GB, 512 samples a step" \
  plan-llama2-7b.log "$ballast" plan --model llama2-7b --gpus 8xA100-40GB,8xV100-32GB \
  --global-batch 512 -o out/plan-llama2-7b.json
step "plan: GPT-13B on 4 V100-32GB + 4 A100-80GB (v100-a100-8), optimal, checked with GLPK" \
  plan-v100-a100-8.log "$ballast" plan --cluster configs/clusters/v100-a100-8.json \
  --method optimal --verify -o out/plan-v100-a100-8.json
step "plan: the same with the published load-aware method" plan-v100-a100-8-patent.log \
  "$ballast" plan --cluster configs/clusters/v100-a100-8.json --method patent --verify \
  -o out/plan-v100-a100-8-patent.json
step "simulate the optimal plan, with a trace" simulate-v100-a100-8.log "$ballast" simulate \
  --plan out/plan-v100-a100-8.json -o out/simulation-v100-a100-8.json \
  --trace out/trace-v100-a100-8.json
step "bench: every method on every shipped GPU cluster and model (out/bench)" bench.log \
  "$ballast" bench --out out/bench

cores=$(nproc)
stages=$(( cores > 2 ? cores : 2 ))
layers=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["n_layer"] + 2)' \
  configs/models/gpt-tiny.json)
stages=$(( stages < layers ? stages : layers )) # a stage holds at least one layer
# The ranks will train side by side, sharing memory bandwidth, caches and whatever else runs
# here, so the profile is measured pinned to core 0 while a copy runs pinned to each other
# core a rank will use (their profiles are only load, left in out/profile-cpu-load/).
profile=("$ballast" profile --model configs/models/gpt-tiny.json --device cpu --threads 1
         --repeats 10)
mkdir -p out/profile-cpu-load
# the machine's CPU ticks and our children's CPU time at a point, to tell how much of the cores
# other processes took while we measured (the machine may be shared)
# (`times` in this shell, not a pipe's subshell: its second line is the waited-for children's)
mark() { { head -1 /proc/stat; getconf CLK_TCK; times; } > "out/profile-cpu-load/$1.txt"; }
measure_cpu() {
  local pin=(taskset -c 0)
  if [ "$stages" -le "$cores" ] && command -v taskset > /dev/null; then
    for k in $(seq 1 $(( stages - 1 ))); do
      taskset -c "$k" "${profile[@]}" -o "out/profile-cpu-load/$k.json" 2> /dev/null &
    done
  else
    pin=()
  fi
  "${pin[@]}" "${profile[@]}" -o out/profile-cpu.json
  wait
}
mark profile-start
step "profile: GPT-tiny measured on this CPU, one thread, as each of $stages ranks runs" \
  profile-cpu.log measure_cpu
mark profile-end
step "plan: $stages CPU stages of this machine (out/cluster-cpu.json), the measured profile" \
  plan-cpu.log bash -c "scripts/cpu-cluster.sh '$ballast' out/profile-cpu.json \
  out/cluster-cpu.json $stages && '$ballast' plan --cluster out/cluster-cpu.json --verify \
  -o out/plan-cpu.json"
bind=(--bind-to core --map-by core)
[ "$stages" -gt "$cores" ] && bind=(--bind-to none)
mark train-start
step "train: the CPU plan, one MPI rank per stage, one thread each" train-cpu.log \
  mpirun --allow-run-as-root --oversubscribe -np "$stages" "${bind[@]}" "$ballast" train \
  --plan out/plan-cpu.json --threads 1 --steps 8 --quiet --metrics out/metrics-cpu.json \
  --trace out/trace-cpu.json
mark train-end

echo
python3 scripts/main_summary.py out "$(( $(date +%s) - start ))"
