#!/usr/bin/env bash
# Tokens per second of `ballast train` against PyTorch on this CPU: the same model (GPT or
# Llama, by the model file's kind: bench/torch_gpt.py builds the twin), one process, the same
# thread count, with and without full recomputation (Ballast: a `--method full` plan;
# PyTorch: torch.utils.checkpoint around every block), 4 micro-batches per step. The model
# file's "attention" picks PyTorch's: "flash" F.scaled_dot_product_attention (PyTorch 2.0 and
# later; on an older one PyTorch's materialised softmax, said in the table: the best attention
# that PyTorch has), otherwise the materialised softmax. The two run
# alternately, REPEATS times each, in one invocation; each run reports tokens/s over its steps
# after the first; the table gives medians and the ratio Ballast / PyTorch.
#
# PyTorch has two thread pools: OpenBLAS's for matrix products and its own (OpenMP) for the
# rest. With T > 1 threads it runs both ways, intra-op T and intra-op 1 (OpenBLAS T in both),
# and the table takes the faster median: on small models the second pool can cost more than
# it gives.
#
# usage: bench/cpu_vs_torch.sh [PATH/TO/ballast]   (default build/ballast)
#   THREADS="1 2"  REPEATS=5  STEPS=5
#   MODELS="configs/models/gpt-tiny.json bench/models/gpt-cpu-small.json
#           configs/models/llama-tiny.json bench/models/llama-cpu-small.json"
#   OUT=bench/results/cpu_vs_torch.md
set -euo pipefail
cd "$(dirname "$0")/.."
ballast=${1:-build/ballast}
threads=${THREADS:-1 2}
repeats=${REPEATS:-5}
steps=${STEPS:-5}
models=${MODELS:-configs/models/gpt-tiny.json bench/models/gpt-cpu-small.json \
  configs/models/llama-tiny.json bench/models/llama-cpu-small.json}
out=${OUT:-bench/results/cpu_vs_torch.md}
py=/usr/bin/python3 # Debian's python3-torch lives here, not in a pyenv
"$py" -c "import torch" 2> /dev/null || { echo "needs python3-torch (apt-get install python3-torch)"; exit 2; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

samples="$work/samples.txt" # model threads mode system tokens/s
shapes="$work/shapes.txt"   # model kind attention
for model in $models; do
  name=$(basename "$model" .json)
  "$py" -c "import json,sys; m=json.load(open(sys.argv[1]))
print(sys.argv[2], m.get('kind', 'gpt'), m.get('attention', 'materialized'))" "$model" "$name" \
    >> "$shapes"
  "$ballast" profile --model "$model" --estimate --device cpu -o "$work/$name-prof.json"
  cat > "$work/$name-cluster.json" << JSON
{"format": "ballast-cluster/1", "schedule": "1f1b", "micro_batches": 4,
 "stages": [{"device": "cpu", "memory_bytes": 17179869184, "profile": "$name-prof.json"}]}
JSON
  for mode in none full; do
    "$ballast" plan --cluster "$work/$name-cluster.json" --method $mode --quiet \
      -o "$work/$name-$mode.json"
  done
  for t in $threads; do
    for r in $(seq "$repeats"); do
      for mode in none full; do
        rec=""; [ $mode = full ] && rec=--recompute
        # alternate which system goes first, so that drift in the machine's load hits both
        order="ballast torch"; [ $((r % 2)) -eq 0 ] && order="torch ballast"
        for sys in $order; do
          if [ $sys = ballast ]; then
            "$ballast" train --plan "$work/$name-$mode.json" --steps "$steps" --threads "$t" \
              --quiet --metrics "$work/m.json" > /dev/null
            tps=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1]))['tokens_per_s'])" "$work/m.json")
            echo "$name $t $mode ballast $tps" | tee -a "$samples"
          else
            intra="$t"; [ "$t" -gt 1 ] && intra="$t 1"
            for k in $intra; do
              "$py" bench/torch_gpt.py "$model" --micro-batches 4 --steps "$steps" \
                --threads "$t" --intra-op "$k" $rec > "$work/t.json" 2> "$work/t.err" ||
                { cat "$work/t.err"; exit 1; }
              # the attention PyTorch ran: sdpa, or manual where it has no flash attention
              read -r tps attn < <("$py" -c "import json,sys; d=json.load(sys.stdin); \
print(d['tokens_per_s'], d['attention'])" < "$work/t.json")
              echo "$name $t $mode torch-intra$k-$attn $tps" | tee -a "$samples"
            done
          fi
        done
      done
    done
  done
done

"$py" - "$samples" "$out" "$repeats" "$steps" "$shapes" << 'PY'
import collections, datetime, os, platform, statistics, subprocess, sys
import torch
samples, out, repeats, steps = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
shape = {l.split()[0]: l.split()[1:] for l in open(sys.argv[5])}
runs = collections.defaultdict(list)
for line in open(samples):
    name, t, mode, system, tps = line.split()
    runs[(name, int(t), mode, system)].append(float(tps))
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
blas = subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libopenblas0-pthread"],
                      capture_output=True, text=True).stdout or "?"
lines = [
    "# Ballast CPU runtime against PyTorch",
    "",
    f"Measured {datetime.datetime.now().strftime('%Y-%m-%d %H:%M')} by `bench/cpu_vs_torch.sh`: "
    f"{cpu}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f} at the end; "
    f"OpenBLAS {blas}, PyTorch {torch.__version__}, Python {platform.python_version()}.",
    "",
    f"One process, 4 micro-batches per step, {steps} steps per run with the first excluded, "
    f"{repeats} runs of each alternating; tokens/s medians (min-max). `full`: every layer "
    "recomputed (Ballast `--method full`; PyTorch `torch.utils.checkpoint` per block). "
    "Attention `flash`: PyTorch's `F.scaled_dot_product_attention`; `materialized`: the "
    "softmax of the whole T x T scores in both.",
    "",
    "| model | kind | attention | threads | recompute | Ballast tokens/s | PyTorch tokens/s "
    "| Ballast / PyTorch |",
    "|---|---|---|---|---|---|---|---|",
]
for (name, t, mode, system) in sorted(k for k in runs if k[3] == "ballast"):
    b = runs[(name, t, mode, "ballast")]
    mb = statistics.median(b)
    row = f"| {name} | {' | '.join(shape[name])} | {t} | {mode} | {mb:.0f} ({min(b):.0f}-{max(b):.0f}) | "
    # PyTorch's better thread setting (intra-op threads)
    torch_runs = [(s[3][len("torch-intra"):], v) for s, v in runs.items()
                  if s[:3] == (name, t, mode) and s[3].startswith("torch")]
    (k, attn), p = max(((s.split("-", 1), v) for s, v in torch_runs),
                       key=lambda kv: statistics.median(kv[1]))
    mp = statistics.median(p)
    fell_back = shape[name][1] == "flash" and attn == "manual"
    note = (f"; materialized: PyTorch {torch.__version__} has no scaled_dot_product_attention"
            if fell_back else "")
    lines.append(row + f"{mp:.0f} ({min(p):.0f}-{max(p):.0f}), intra-op {k}{note} | "
                 f"{mb / mp:.2f} |")
text = "\n".join(lines) + "\n"
open(out, "w").write(text)
print(text)
PY
