"""The main job's last screen (scripts/main.sh): the headline numbers of each step and where
its files are. Exit 1 when a CPU stage's measured memory misses its plan by more than 2%.

usage: python3 scripts/main_summary.py OUT_DIR SECONDS
"""
import csv
import json
import os
import re
import statistics
import sys

out, seconds = sys.argv[1], int(sys.argv[2])


def path(*parts):
    return os.path.join(out, *parts)


def load(name):
    with open(path(name)) as f:
        return json.load(f)


def one_line_plan():
    """The per-kind table and throughput of the one-line plan, from its log."""
    log = open(path("logs", "plan-llama2-7b.log")).read().splitlines()
    start = next(i for i, l in enumerate(log) if l.startswith("device kind"))
    end = next(i for i, l in enumerate(log) if l.startswith("throughput:"))
    print("Llama-2-7B on 8 A100-40GB + 8 V100-32GB, 512 samples a step, planned in one line")
    print(f"(out/plan-llama2-7b.json; the cluster it wrote: out/plan-llama2-7b.cluster.json):")
    for line in log[start:end + 1]:
        print("  " + line)


def bench_rows():
    with open(path("bench", "results.csv")) as f:
        return list(csv.DictReader(f))


def mixed_cluster(rows):
    """GPT-13B on v100-a100-8: Ballast's method against the published one and full."""
    opt, patent = load("plan-v100-a100-8.json"), load("plan-v100-a100-8-patent.json")
    full = next((float(r["iteration_ms"]) for r in rows if r["cluster"] == "v100-a100-8"
                 and r["model"] == "gpt-13b" and r["method"] == "full" and r["status"] == "ok"),
                None)
    agree = opt.get("verify", {}).get("agree")
    print(f"GPT-13B on 4 V100-32GB + 4 A100-80GB (out/plan-v100-a100-8.json; DP and GLPK "
          f"{'agree' if agree else 'DISAGREE'}):")
    line = (f"  optimal {opt['iteration_ms']:.0f} ms a step; published method "
            f"{patent['iteration_ms']:.0f} ms ({patent['iteration_ms'] / opt['iteration_ms']:.2f}x)")
    if full:
        line += f"; recompute all {full:.0f} ms ({full / opt['iteration_ms']:.2f}x)"
    print(line)
    print("  its simulated step: out/trace-v100-a100-8.json (open it in ui.perfetto.dev)")


def bench(rows):
    cases = {(r["cluster"], r["model"]) for r in rows}
    runnable = {k for k in cases if all(r["status"] != "cannot run" for r in rows
                                        if (r["cluster"], r["model"]) == k)}
    fits = {m: sum(1 for r in rows if r["method"] == m and r["status"] == "ok")
            for m in ("full", "optimal", "optimal+repartition")}
    print(f"bench: {len({c for c, _ in cases})} clusters x {len({m for _, m in cases})} models, "
          f"{len(runnable)} runnable; they fit with full recomputation {fits['full']},")
    print(f"  optimal {fits['optimal']}, optimal+repartition {fits['optimal+repartition']}")
    for method in ("optimal", "optimal+repartition"):
        s = [float(r["speedup_vs_full"]) for r in rows
             if r["method"] == method and r["speedup_vs_full"]]
        if s:
            print(f"  {method} over full recomputation: {min(s):.2f}x to {max(s):.2f}x, "
                  f"median {statistics.median(s):.2f}x ({len(s)} cases)")
    print("  tables: out/bench/results.md, .csv; plots: out/bench/iteration.png, memory.png, "
          "gantt.png")


def others(phase):
    """% of the cores' time other processes took between the marks of `phase`"""
    def read(point):
        text = open(path("profile-cpu-load", f"{phase}-{point}.txt")).read()
        stat, tck, _, ours = text.splitlines()
        ticks = [int(x) for x in stat.split()[1:]]
        m = [float(a) * 60 + float(b) for a, b in re.findall(r"(\d+)m([\d.]+)s", ours)]
        return sum(ticks) / int(tck), (ticks[3] + ticks[4]) / int(tck), sum(m)
    (t0, i0, o0), (t1, i1, o1) = read("start"), read("end")
    return 100 * max(t1 - t0 - (i1 - i0) - (o1 - o0), 0) / (t1 - t0)


def pct(got, ref):
    return 100.0 * (got - ref) / ref


def cpu():
    """Planned against measured per stage; whether memory is within 2%."""
    plan, metrics = load("plan-cpu.json"), load("metrics-cpu.json")
    n = len(plan["stages"])
    print(f"this CPU: GPT-tiny trained on {n} stages (out/plan-cpu.json, metrics-cpu.json, "
          f"trace-cpu.json)")
    print("  stage  recomputed            memory MiB: plan  measured   diff  "
          "compute ms: plan  measured   diff")
    memory_ok = compute_ok = True
    for i, (p, m) in enumerate(zip(plan["stages"], metrics["stages"])):
        rec = [str(l) for l in p["recompute"]]
        rec += [f"{o['layer']}:{o['option']}" for o in p.get("recompute_options", [])]
        measured = m["fwd_ms"] + m["bwd_ms"] + m["recompute_ms"]
        dm, dt = pct(m["peak_bytes"], m["planned_bytes"]), pct(measured, p["stage_ms"])
        memory_ok &= abs(dm) <= 2
        compute_ok &= abs(dt) <= 25
        rec = ",".join(rec) or "-"
        rec = rec if len(rec) <= 20 else rec[:17] + "..."
        print(f"  {i:5d}  {rec:<20s}  {m['planned_bytes'] / 2**20:16.2f}  "
              f"{m['peak_bytes'] / 2**20:8.2f}  {dm:+5.1f}%  {p['stage_ms']:16.1f}  "
              f"{measured:8.1f}  {dt:+5.1f}%")
    print(f"  memory {'within' if memory_ok else 'OUTSIDE'} the goal of 2%, compute "
          f"{'within' if compute_ok else 'outside'} 25%; other processes took "
          f"{others('profile'):.0f}% of the cores")
    print(f"  while profiling, {others('train'):.0f}% while training")
    if not compute_ok:
        print("  (compute varies with what else runs here: bench/results/validate_cpu.md has "
              "quiet runs)")
    return memory_ok


print(f"== done in {seconds // 60}m {seconds % 60:02d}s; everything is in out/, each step's "
      f"output in out/logs/")
print()
one_line_plan()
print()
rows = bench_rows()
mixed_cluster(rows)
bench(rows)
print()
sys.exit(0 if cpu() else 1)
