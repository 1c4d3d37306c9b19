"""A measured profile against the estimate for the same GPU and model: each kind of layer's
forward and backward time as measured / estimated, the FLOP rate the measurement reached, and
the memory the two agree on. Writes a Markdown section to standard output.

The estimate is a roofline (configs/devices.json: each operation max(flops / (peak x
gemm_efficiency), bytes / (bandwidth x memory_efficiency)) plus an overhead), so a block's
measured/estimated ratio r says what gemm_efficiency would have made the estimate exact for
a compute-bound block: gemm_efficiency / r.

usage: compare_profiles.py MEASURED.json ESTIMATED.json [DEVICES.json]
"""
import json
import statistics
import sys


def kind(name):
    return name.split(".")[0]


def main():
    measured, estimated = (json.load(open(f)) for f in sys.argv[1:3])
    devices = json.load(open(sys.argv[3] if len(sys.argv) > 3 else "configs/devices.json"))
    table = devices.get("assumptions", {})
    gemm = table.get("gemm_efficiency", 0.6)
    est = {layer["name"]: layer for layer in estimated["layers"]}
    rows = {}
    for layer in measured["layers"]:
        e = est.get(layer["name"])
        if e is None or e["fwd_ms"] <= 0 or e["bwd_ms"] <= 0:
            continue
        r = rows.setdefault(kind(layer["name"]), {"fwd": [], "bwd": [], "act": [], "state": []})
        r["fwd"].append(layer["fwd_ms"] / e["fwd_ms"])
        r["bwd"].append(layer["bwd_ms"] / e["bwd_ms"])
        r["act"].append(layer["act_bytes"] / e["act_bytes"] if e["act_bytes"] else float("nan"))
        r["state"].append(layer["state_bytes"] / e["state_bytes"] if e["state_bytes"]
                          else float("nan"))
    m = measured["model"]
    name = m.get("name") or sys.argv[1].rsplit("/", 1)[-1].removesuffix(".json")
    print(f"### {name} ({m.get('dtype', '?')}, micro-batch "
          f"{m.get('micro_batch', '?')} x {m.get('seq_len', '?')} tokens) on "
          f"{measured['device']['name']}")
    print()
    print("| layers | count | fwd measured / estimated | bwd measured / estimated | "
          "act_bytes measured / estimated | state_bytes measured / estimated |")
    print("|---|---|---|---|---|---|")
    for k, r in rows.items():
        med = {x: statistics.median(v) for x, v in r.items()}
        print(f"| {k} | {len(r['fwd'])} | {med['fwd']:.3f} | {med['bwd']:.3f} | "
              f"{med['act']:.4f} | {med['state']:.4f} |")
    if "block" in rows:
        both = statistics.median(rows["block"]["fwd"] + rows["block"]["bwd"])
        print()
        print(f"A block runs at {1 / both:.2f}x the estimate's speed: the estimate's "
              f"gemm_efficiency {gemm} would be {gemm / both:.2f} for this runtime on this GPU "
              f"(where the block is compute-bound).")
    print()


if __name__ == "__main__":
    main()
