"""Tables of bench/gpu/run.sh and mixed.sh samples (one JSON object per line).

usage: report.py vs-torch SAMPLES OUT.md GPU DEVICE MICRO_BATCHES STEPS REPEATS MODEL.json...
       report.py mixed SAMPLES OUT.md GPU DEVICE
"""
import collections
import datetime
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEVICES = os.path.join(HERE, "..", "..", "configs", "devices.json")


def flops_per_token(m):
    """6 x the weights multiplied by (per block 12 C^2, the output projection V C) plus the
    attention's 12 L C T (PaLM's and llm.c's count; no recomputation)."""
    L, C, T, V = m["n_layer"], m["n_embd"], m["seq_len"], m["vocab_size"]
    return 6 * (12 * L * C * C + V * C) + 12 * L * C * T


def peak_flops(device, dtype):
    """The dense peak for MFU; None (unknown) for a GPU the table does not hold, or an fp16
    run on one whose fp16 peak it does not state."""
    key = {"bf16": "peak_tflops_16bit", "fp16": "peak_tflops_fp16"}.get(dtype, "peak_tflops_fp32")
    for d in json.load(open(DEVICES))["devices"]:
        if d["name"] == device:
            return 1e12 * d[key] if key in d else None
    return None


def med(v):
    return f"{statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f})"


def vs_torch(samples, out, gpu, device, mb, steps, repeats, models):
    runs = collections.defaultdict(list)
    peak = collections.defaultdict(list)
    torch_version = "?"
    for line in open(samples):
        r = json.loads(line)
        key = (r["model"], r["dtype"], r["recompute"], r["system"])
        runs[key].append(r["tokens_per_s"])
        peak[key].append(r["peak_bytes"])
        torch_version = r.get("torch", torch_version)
    spec = {os.path.basename(p)[:-5]: json.load(open(p)) for p in models}
    lines = [
        f"# Ballast on {gpu} against PyTorch",
        "",
        f"Measured {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} by `bench/gpu/run.sh` on "
        f"{gpu} (device table: {device}); PyTorch {torch_version}. One process, {mb} "
        f"micro-batches per step, {steps} steps per run (Ballast excludes the first, PyTorch the "
        f"first two: torch.compile compiles there), {repeats} runs of each, alternating. "
        "tokens/s medians (min-max); MFU from the median and the device table's dense peak "
        "(`unknown` for a GPU the table does not hold); `full`: every layer recomputed. "
        "PyTorch attention: scaled_dot_product_attention (flash); fp32 without TF32 for both.",
        "",
        "| model | dtype | recompute | Ballast tok/s | MFU | PyTorch eager tok/s | MFU | "
        "torch.compile tok/s | MFU | Ballast / eager | Ballast / compile | peak MiB B / eager |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (name, dt, rec, system) in sorted(k for k in runs if k[3] == "ballast"):
        m = spec.get(name)
        pk = peak_flops(device, dt)
        cells = []
        meds = {}
        for s in ("ballast", "eager", "compile"):
            v = runs.get((name, dt, rec, s), [])
            if not v:
                cells += ["-", "-"]
                continue
            meds[s] = statistics.median(v)
            mfu = (f"{100 * meds[s] * flops_per_token(m) / pk:.1f}%" if pk and m else "unknown")
            cells += [med(v), mfu]
        ratio = [f"{meds['ballast'] / meds[s]:.2f}" if s in meds else "-"
                 for s in ("eager", "compile")]
        pb = statistics.median(peak[(name, dt, rec, "ballast")]) / 2**20
        pe = peak.get((name, dt, rec, "eager"))
        mem = f"{pb:.0f} / {statistics.median(pe) / 2**20:.0f}" if pe else f"{pb:.0f} / -"
        lines.append(f"| {name} | {dt} | {rec} | " + " | ".join(cells) + " | " +
                     " | ".join(ratio) + f" | {mem} |")
    lines += ["", "Ballast's peak is its arenas' measured high-water mark; PyTorch's "
              "is torch.cuda.max_memory_allocated. Neither counts the CUDA context or library "
              "workspaces (Ballast's metrics report those separately)."]
    open(out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


def mixed(samples, out, gpu, device):
    lines = [
        f"# Four ranks on one {gpu}: a mixed cluster emulated by per-rank memory limits",
        "",
        f"Measured {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} by `bench/gpu/mixed.sh` "
        f"(device table: {device}). Each run: `mpirun -np 4 ballast train` on one GPU, "
        "host-staged MPI between the ranks (NCCL refuses ranks sharing a GPU); the plan's "
        "per-stage limits stand for GPUs of different sizes. Measured peak against the plan, per "
        "stage; device memory beside the arenas as the metrics report it.",
        "",
    ]
    for line in open(samples):
        r = json.loads(line)
        lines += [f"## {r['model']} {r['dtype']}, method {r['method']}, MPS: {r['mps']}", "",
                  f"tokens/s {r['tokens_per_s']:.0f}; transport {r['transport']}", ""]
        if "measured_step_ms" in r:
            lines += [f"step ms: measured {r['measured_step_ms']:.1f} (median after the first); "
                      f"planned {r['planned_step_ms']:.1f} (a GPU per stage) and "
                      f"{r['one_gpu_ms']:.1f} (every stage's compute on the one GPU in turn), "
                      f"from the {r['profile']} profile", ""]
        lines += ["| stage | layers | recomputed | limit MiB | planned MiB | measured MiB | diff | "
                  "context MiB | cuBLAS MiB | MPS threads % |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for s in r["stages"]:
            diff = 100 * (s["peak_bytes"] - s["planned_bytes"]) / s["planned_bytes"]
            lines.append(
                f"| {s['index']} | {s['layers']} | {s['recomputed']} | "
                f"{s['limit_bytes'] / 2**20:.0f} | {s['planned_bytes'] / 2**20:.1f} | "
                f"{s['peak_bytes'] / 2**20:.1f} | {diff:+.2f}% | "
                f"{s['context_bytes'] / 2**20:.0f} | {s['cublas_bytes'] / 2**20:.0f} | "
                f"{s.get('mps_percent', '-')} |")
        lines.append("")
    open(out, "w").write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    if sys.argv[1] == "vs-torch":
        vs_torch(*sys.argv[2:9], sys.argv[9:])
    else:
        mixed(*sys.argv[2:6])
