#!/usr/bin/env bash
# The main job on this machine's CPU: install what is missing, build, estimate the profiles
# the shipped clusters use, plan and simulate a mixed GPU cluster, run the bench, plan the
# small CPU cluster, then train the CPU plan on three MPI ranks and compare measured against
# planned memory per stage.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
mkdir -p out
echo "== estimated profiles (configs/profiles/estimated)"
configs/make-profiles.sh "$build/ballast"
echo "== plan: 4 V100-32GB + 4 A100-80GB, GPT-13B, Ballast's optimal method, checked with GLPK"
"$build/ballast" plan --cluster configs/clusters/v100-a100-8.json --method optimal --verify \
  -o out/plan-v100-a100-8.json
echo "== plan: the same cluster with the published load-aware method"
"$build/ballast" plan --cluster configs/clusters/v100-a100-8.json --method patent --verify \
  -o out/plan-v100-a100-8-patent.json
echo "== plan: three CPU stages of this machine, GPT-tiny"
"$build/ballast" plan --cluster configs/clusters/cpu-3.json --verify -o out/plan-cpu-3.json
echo "== simulate the optimal plan: iteration time, bubble, a trace for ui.perfetto.dev"
"$build/ballast" simulate --plan out/plan-v100-a100-8.json -o out/simulation-v100-a100-8.json \
  --trace out/trace-v100-a100-8.json
echo "== bench: every method on every shipped GPU cluster and model (tables and plots in out/bench)"
"$build/ballast" bench --out out/bench
echo "== train: the CPU plan, one MPI rank per stage of this machine (stage 0 recomputes as planned)"
mpirun --allow-run-as-root --oversubscribe -np 3 "$build/ballast" train --plan out/plan-cpu-3.json \
  --steps 8 --metrics out/metrics-cpu-3.json --trace out/trace-cpu-3.json
