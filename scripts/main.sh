#!/usr/bin/env bash
# The main job on this machine's CPU: install what is missing, build, estimate the profiles
# the shipped clusters use, plan and simulate a mixed GPU cluster, run the bench; then measure
# this machine's CPU (one thread, what each rank gets), plan GPT-tiny on as many stages as it
# has cores (at least 2; stage 0 given too little memory to keep everything, so it
# recomputes), train that plan on one MPI rank per stage, and end on a table of planned
# against measured memory and compute per stage.
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
echo "== simulate the optimal plan: iteration time, bubble, a trace for ui.perfetto.dev"
"$build/ballast" simulate --plan out/plan-v100-a100-8.json -o out/simulation-v100-a100-8.json \
  --trace out/trace-v100-a100-8.json
echo "== bench: every method on every shipped GPU cluster and model (tables and plots in out/bench)"
"$build/ballast" bench --out out/bench
cores=$(nproc)
stages=$(( cores > 2 ? cores : 2 ))
layers=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["n_layer"] + 2)' \
  configs/models/gpt-tiny.json)
stages=$(( stages < layers ? stages : layers )) # a stage holds at least one layer
echo "== profile: GPT-tiny measured on this machine's CPU, one thread, as each of $stages ranks runs"
# The ranks will train side by side, sharing memory bandwidth, caches and whatever else runs
# here, so the profile is measured pinned to core 0 while a copy runs pinned to each other
# core a rank will use (their profiles are only load, left in out/profile-cpu-load/).
profile=("$build/ballast" profile --model configs/models/gpt-tiny.json --device cpu --threads 1
         --repeats 10)
mkdir -p out/profile-cpu-load
# the machine's CPU ticks and our children's CPU time at a point, to tell how much of the cores
# other processes took while we measured (the machine may be shared)
# (`times` in this shell, not a pipe's subshell: its second line is the waited-for children's)
mark() { { head -1 /proc/stat; getconf CLK_TCK; times; } > "out/profile-cpu-load/$1.txt"; }
mark profile-start
pin=(taskset -c 0)
if [ "$stages" -le "$cores" ] && command -v taskset > /dev/null; then
  for k in $(seq 1 $(( stages - 1 ))); do
    taskset -c "$k" "${profile[@]}" -o "out/profile-cpu-load/$k.json" 2> /dev/null &
  done
else
  pin=()
fi
"${pin[@]}" "${profile[@]}" -o out/profile-cpu.json
wait
mark profile-end
echo "== plan: CPU stages of this machine (out/cluster-cpu.json), the measured profile"
scripts/cpu-cluster.sh "$build/ballast" out/profile-cpu.json out/cluster-cpu.json "$stages"
"$build/ballast" plan --cluster out/cluster-cpu.json --verify -o out/plan-cpu.json
echo "== train: the CPU plan, one MPI rank per stage, one thread each"
bind=(--bind-to core --map-by core)
[ "$stages" -gt "$cores" ] && bind=(--bind-to none)
mark train-start
mpirun --allow-run-as-root --oversubscribe -np "$stages" "${bind[@]}" "$build/ballast" train \
  --plan out/plan-cpu.json --threads 1 --steps 8 --quiet --metrics out/metrics-cpu.json \
  --trace out/trace-cpu.json
mark train-end
echo "== planned against measured, per stage (goals: memory within 2%, compute within 25%)"
python3 - out/plan-cpu.json out/metrics-cpu.json out/profile-cpu-load <<'PY'
import json, re, sys
plan, metrics = (json.load(open(f)) for f in sys.argv[1:3])
def others(phase):
    """% of the cores' time other processes took between the marks of `phase`"""
    def read(point):
        stat, tck, _, ours = open(f"{sys.argv[3]}/{phase}-{point}.txt").read().splitlines()
        ticks = [int(x) for x in stat.split()[1:]]
        m = [float(a) * 60 + float(b) for a, b in re.findall(r"(\d+)m([\d.]+)s", ours)]
        return sum(ticks) / int(tck), (ticks[3] + ticks[4]) / int(tck), sum(m)
    (t0, i0, o0), (t1, i1, o1) = read("start"), read("end")
    return 100 * max(t1 - t0 - (i1 - i0) - (o1 - o0), 0) / (t1 - t0)
def pct(got, ref): return 100.0 * (got - ref) / ref
print("stage  recomputed                    memory MiB: planned  measured    diff  ok   "
      "compute ms: planned  measured    diff  ok")
memory_ok = compute_ok = True
for i, (p, m) in enumerate(zip(plan["stages"], metrics["stages"])):
    rec = [str(l) for l in p["recompute"]]
    rec += [f"{o['layer']}:{o['option']}" for o in p.get("recompute_options", [])]
    measured = m["fwd_ms"] + m["bwd_ms"] + m["recompute_ms"]
    dm, dt = pct(m["peak_bytes"], m["planned_bytes"]), pct(measured, p["stage_ms"])
    memory_ok &= abs(dm) <= 2
    compute_ok &= abs(dt) <= 25
    print(f"{i:5d}  {','.join(rec) or '-':<28s}  {m['planned_bytes'] / 2**20:19.2f}  "
          f"{m['peak_bytes'] / 2**20:8.2f}  {dm:+6.2f}%  {'yes' if abs(dm) <= 2 else 'NO':>3}  "
          f"{p['stage_ms']:19.3f}  {measured:8.3f}  {dt:+6.2f}%  "
          f"{'yes' if abs(dt) <= 25 else 'NO':>3}")
print(f"other processes took {others('profile'):.0f}% of the cores' time while profiling, "
      f"{others('train'):.0f}% while training")
if not compute_ok:
    print("compute outside 25%: other processes shared the cores the profile and the ranks ran "
          "on, by different amounts (above); bench/results/validate_cpu.md has quiet runs within 5%")
sys.exit(0 if memory_ok else 1)
PY
