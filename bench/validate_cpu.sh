#!/usr/bin/env bash
# The cost model against real runs on this machine's CPU: profile GPT-tiny here (one thread),
# measure the MPI link between two ranks with a ping-pong, plan, train each plan on MPI ranks
# with one thread each, and print per stage the planned against the measured memory and time
# per micro-batch, and the simulated against the measured iteration time.
#
# Four plans:
#   options  two pipeline stages (stage 0 too small to keep every activation, so it
#            recomputes), Ballast's optimal, which may recompute part of a layer (an option);
#   whole    the same with whole layers only (--whole-layers);
#   dp2      one stage replicated twice (dp 2): two ranks, each its core, the gradients
#            reduced in buckets over the ping-pong's link;
#   dp3      one stage replicated three times: three ranks sharing the two cores, so its
#            profile is measured the same way, by three profilers at once (each layer's median
#            over the three).
# The two-stage plans and dp2 run on two ranks bound to the two cores.
#
# Goals: memory within 2%, stage time within 10%, iteration time within 10% (the pipelines)
# and 5% (data parallel). A machine busy with other work misses them: the script reports how
# much CPU other processes took while it measured.
#
# usage: bench/validate_cpu.sh [BUILD_DIR [OUT_DIR]]    (defaults: build, out/validate-cpu)
#        RUNS=3 STEPS=20 REPEATS=30 bench/validate_cpu.sh   (training runs, steps each,
#                                                           profile repeats)
#        PLANS="dp2 dp3" bench/validate_cpu.sh               (which of the four)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
out=${2:-out/validate-cpu}
runs=${RUNS:-3}
steps=${STEPS:-20}
repeats=${REPEATS:-30}
read -r -a variants <<< "${PLANS:-options whole dp2 dp3}"
ballast="$build/ballast"
cores=$(nproc)
if [ "$cores" -lt 2 ]; then
  echo "validate_cpu: needs 2 cores (one per rank), this machine has $cores" >&2
  exit 2
fi
mpirun_np() { # NP BIND ...: mpirun of NP ranks, bound to cores (core) or not (none)
  local np=$1 bind=$2
  shift 2
  timeout 600 mpirun --allow-run-as-root --oversubscribe -np "$np" --bind-to "$bind" \
    --map-by core "$@"
}
ranks() { case $1 in dp3) echo 3 ;; *) echo 2 ;; esac; }
binding() { case $1 in dp3) echo none ;; *) echo core ;; esac; }
mkdir -p "$out"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)

echo "== profile: GPT-tiny on this CPU, one thread, $repeats timed passes"
"$ballast" profile --model configs/models/gpt-tiny.json --device cpu --threads 1 \
  --repeats "$repeats" -o "$out/profile.json"
if [[ " ${variants[*]} " == *" dp3 "* ]]; then
  echo "== profile: the same by three profilers at once (dp3's three ranks on two cores)"
  # each keeps its core share busy once done (a spinning filler) until all three are, so that
  # every timed pass shares the cores three ways, as the ranks do
  rm -f "$out"/profile3-?.json
  for k in 0 1 2; do
    ("$ballast" profile --model configs/models/gpt-tiny.json --device cpu --threads 1 \
       --repeats "$repeats" -o "$out/profile3-$k.json"
     python3 -c 'import glob, sys
while len(glob.glob(sys.argv[1] + "/profile3-?.json")) < 3:
    sum(range(100000))' "$out") &
  done
  wait
fi

echo "== link: MPI ping-pong between the two pinned ranks"
mpirun_np 2 core "$build/bench/pingpong" --bytes 262144 > "$out/link.json"
cat "$out/link.json"

# The pipelines: embed + blocks 0-2 (two micro-batches in flight under 1F1B) in 42 MiB, which
# is less than the 43.6 MiB keeping everything takes, and blocks 3-5 + head in 64 MiB. The
# replicas: all the layers in one stage of 96 MiB, 8 micro-batches a replica.
python3 - "$out" <<'PY'
import json, os, statistics as st, sys
out = sys.argv[1]
prof = json.load(open(f"{out}/profile.json"))
link = json.load(open(f"{out}/link.json"))
dev = prof["device"]["name"]
shared = [f"{out}/profile3-{k}.json" for k in range(3)]
if all(os.path.exists(f) for f in shared):  # each layer's median over the three profilers
    ps = [json.load(open(f)) for f in shared]
    merged = ps[0]
    for l, layer in enumerate(merged["layers"]):
        for key in ("fwd_ms", "bwd_ms", "optimizer_ms"):
            layer[key] = st.median(p["layers"][l][key] for p in ps)
        for k, o in enumerate(layer.get("recompute_options", [])):
            o["recompute_ms"] = st.median(p["layers"][l]["recompute_options"][k]["recompute_ms"]
                                          for p in ps)
    merged["device"]["name"] = dev
    merged["provenance"]["measured_by"] = "three profilers at once, each layer's median"
    json.dump(merged, open(f"{out}/profile3.json", "w"), indent=1)
link_obj = {"gbps": link["gbps"], "latency_us": link["latency_us"]}
def cluster(with_link, stages, dp=None, profile="profile.json"):
    c = {"format": "ballast-cluster/1", "name": "cpu-validate",
         "description": "CPU ranks of this machine, GPT-tiny, a measured profile",
         "schedule": "1f1b", "micro_batches": 8, "stages": []}
    for mem, layers in stages:
        s = {"device": dev, "memory_bytes": mem << 20, "profile": profile, "layers": layers}
        if dp:
            s["dp"] = dp
        c["stages"].append(s)
    if with_link:
        c["link" if dp is None else "dp_link"] = link_obj
    return c
pipe = [(42, [0, 3]), (64, [4, 7])]
for name, stages, dp, profile in [("pipe", pipe, None, "profile.json"),
                                   ("dp2", [(96, [0, 7])], 2, "profile.json"),
                                   ("dp3", [(96, [0, 7])], 3, "profile3.json")]:
    json.dump(cluster(True, stages, dp, profile), open(f"{out}/cluster-{name}.json", "w"), indent=2)
    json.dump(cluster(False, stages, dp, profile),
              open(f"{out}/cluster-{name}-free-link.json", "w"), indent=2)
PY

echo "== plan: ${variants[*]}"
for v in "${variants[@]}"; do
  flag="" c=$v
  case $v in options) c=pipe ;; whole) c=pipe flag=--whole-layers ;; esac
  "$ballast" plan --cluster "$out/cluster-$c.json" $flag --quiet -o "$out/plan-$v.json"
  "$ballast" plan --cluster "$out/cluster-$c-free-link.json" $flag --quiet \
    -o "$out/plan-$v-free-link.json"
done

echo "== train: $runs runs of $steps steps of each plan, one thread a rank"
# The machine is shared: CPU time of all processes (/proc/stat) against our ranks' own tells
# how much others took while we measured.
head -1 /proc/stat > "$out/stat-before.txt"
for r in $(seq 1 "$runs"); do
  for v in "${variants[@]}"; do
    # each rank's peak resident memory and CPU seconds (GNU time; OMPI_COMM_WORLD_RANK names
    # the rank)
    mpirun_np "$(ranks "$v")" "$(binding "$v")" sh -c \
      'exec /usr/bin/time -f "%M %U %S" -o "$0/rss-$1-$OMPI_COMM_WORLD_RANK.txt" \
        "$2" train --plan "$0/plan-$4.json" --steps "$3" --threads 1 --quiet \
        --metrics "$0/metrics-$1.json"' \
      "$out" "$v-$r" "$ballast" "$steps" "$v" > "$out/train-$v-$r.log"
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
head -1 /proc/stat > "$out/stat-after.txt"
getconf CLK_TCK > "$out/clk-tck.txt"

python3 - "$out" "$runs" "$steps" "$load_before" "$load_after" "${variants[@]}" <<'PY'
import json, statistics as st, sys
out, runs, n_steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
load_before, load_after, variants = sys.argv[4], sys.argv[5], sys.argv[6:]
prof = json.load(open(f"{out}/profile.json"))
link = json.load(open(f"{out}/link.json"))
pv = prof["provenance"]
n_ranks = {v: 3 if v == "dp3" else 2 for v in variants}
def rank_times(v):
    return [[open(f"{out}/rss-{v}-{r}-{k}.txt").read().split()[-3:] for r in range(1, runs + 1)]
            for k in range(n_ranks[v])]
ours = sum(float(t[1]) + float(t[2]) for v in variants for ts in rank_times(v) for t in ts)
def stat(f):
    v = [int(x) for x in open(f).read().split()[1:]]
    return sum(v), v[3] + v[4]  # all, idle + iowait
tck = int(open(f"{out}/clk-tck.txt").read())
(a0, i0), (a1, i1) = stat(f"{out}/stat-before.txt"), stat(f"{out}/stat-after.txt")
busy, window = (a1 - a0 - (i1 - i0)) / tck, (a1 - a0) / tck
others = max(busy - ours, 0.0)
def pct(got, ref): return 100.0 * (got - ref) / ref
def verdict(d, goal): return "yes" if abs(d) <= goal else "NO"
print(f"\nmachine: {pv['device']}, {pv['cores_online']} cores, host {pv['host']}; "
      f"load average {load_before} before, {load_after} after")
print(f"while training: our ranks {ours:.1f} CPU s, other processes {others:.1f} CPU s, of "
      f"{window:.1f} core-seconds ({100 * others / window:.0f}% taken by others)")
if others > 0.05 * window:
    print("  the machine was shared while it measured: the times below measure the sharing "
          "as well; run it again when the machine is quiet")
print(f"profile: {pv['libraries']['openblas']}; {pv['threads']} thread, "
      f"{pv['measurement']['repeats']} timed samples, medians")
print(f"link (ping-pong, {link['bytes']} bytes): {link['one_way_us']:.1f} us one way = "
      f"{link['latency_us']:.2f} us + {link['gbps']:.1f} Gb/s")
print(f"training: {runs} runs x {n_steps} steps of each plan, 1 thread a rank; per stage the "
      "median over runs of each run's mean over steps 2..N")
for v in variants:
    plan = json.load(open(f"{out}/plan-{v}.json"))
    free = json.load(open(f"{out}/plan-{v}-free-link.json"))
    mets = [json.load(open(f"{out}/metrics-{v}-{r}.json")) for r in range(1, runs + 1)]
    rss = [[int(t[0]) / 1024 for t in ts] for ts in rank_times(v)]
    dp = plan["stages"][0].get("dp", 1)
    goal = 5 if dp > 1 else 10
    print(f"\nplan {v}: {plan['method']}, {len(plan['stages'])} stage(s), dp {dp}, "
          f"{plan['micro_batches']} micro-batches a replica, {plan['schedule']}, "
          f"{n_ranks[v]} ranks")
    print("stage  layers  recomputed          memory MiB: planned  measured   diff  <=2%   "
          "ms/micro-batch: planned  measured   diff  <=10%   recompute: planned  measured   "
          "send ms  idle ms  allreduce ms  max RSS MiB")
    for i, s in enumerate(plan["stages"]):
        ms = [m["stages"][i] for m in mets]
        rec = [str(l) for l in s["recompute"]]
        rec += [f"{o['layer']}:{o['option']}" for o in s.get("recompute_options", [])]
        planned_mem = s["memory_bytes"] - plan.get("reserve_bytes", 0)
        peak = st.median(x["peak_bytes"] for x in ms)
        got = st.median(x["fwd_ms"] + x["bwd_ms"] + x["recompute_ms"] for x in ms)
        rms = st.median(x["recompute_ms"] for x in ms)
        dm, dt = pct(peak, planned_mem), pct(got, s["stage_ms"])
        print(f"{i:5d}  {s['layers'][0]}-{s['layers'][1]:<5d} {','.join(rec) or '-':<18s}  "
              f"{planned_mem / 2**20:19.2f}  {peak / 2**20:8.2f} {dm:+6.2f}%  "
              f"{verdict(dm, 2):>4}   {s['stage_ms']:23.3f}  {got:8.3f} {dt:+6.2f}%  "
              f"{verdict(dt, 10):>4}   {s['recompute_ms']:18.3f}  {rms:8.3f}  "
              f"{st.median(x['send_ms'] for x in ms):8.3f} "
              f"{st.median(x['idle_ms'] for x in ms):8.3f}  "
              f"{st.median(x.get('allreduce_ms', 0) for x in ms):12.3f}  {st.median(rss[i]):11.1f}")
    steps = [x["ms"] for m in mets for x in m["steps"][1:]]
    measured = st.median(steps)
    d = pct(measured, plan["iteration_ms"])
    print(f"iteration ms: simulated {plan['iteration_ms']:.3f} (with the ping-pong link; "
          f"{free['iteration_ms']:.3f} with free transfers), measured {measured:.3f} "
          f"(median of {len(steps)} steps, first of each run left out; "
          f"{min(steps):.1f} to {max(steps):.1f}): {d:+.2f}%  within {goal}%: {verdict(d, goal)}")
    opt = max(st.median(m["stages"][i]["optimizer_ms"] for m in mets)
              for i in range(len(plan["stages"])))
    planned_opt = max(sum(l.get("optimizer_ms", 0) for l in s["layer_costs"])
                      for s in plan["stages"])
    print(f"the AdamW step: planned {planned_opt:.3f} ms, measured {opt:.3f} ms per step on the "
          "slower stage")
PY
