"""A pool file as bench/pool.sh and bench/pool_vs.sh plan it: KINDS (2 or 3: A100-40GB +
V100-32GB (+ H100-80GB); v16: A100-40GB + V100-16GB) sharing GPUS evenly in nodes of 8, a global
batch of 512 samples, the profiles TMP/MODEL-DEVICE.json. DP (0: none) fixes "dp"; SIZES ("1,2,4"
or "") adds "micro_batch_sizes".
Usage: python3 bench/pool_file.py TMP MODEL KINDS GPUS DP OUT [SIZES]"""
import json
import sys

tmp, model, k, n, dp, dst = sys.argv[1:7]
sizes = sys.argv[7] if len(sys.argv) > 7 else ""
n = int(n)
if k == "v16":
    kinds = [("A100-40GB", 40e9, 2400), ("V100-16GB", 16e9, 1200)]
else:
    kinds = [("A100-40GB", 40e9, 2400), ("V100-32GB", 32e9, 1200), ("H100-80GB", 80e9, 3600)][:int(k)]
share = n // len(kinds) // 8 * 8
counts = [share] * len(kinds)
counts[0] += n - share * len(kinds)
c = {"format": "ballast-cluster/1", "schedule": "1f1b", "global_batch": 512,
     "link": {"gbps": 100, "latency_us": 5}, "dp_link": {"gbps": 100, "latency_us": 5},
     "shard_optimizer": True,
     "pool": [{"device": d, "count": cnt, "per_node": 8, "memory_bytes": int(mem),
               "profile": f"{tmp}/{model}-{d}.json", "node_link": {"gbps": g, "latency_us": 2}}
              for (d, mem, g), cnt in zip(kinds, counts)]}
if int(dp):
    c["dp"] = int(dp)
if sizes:
    c["micro_batch_sizes"] = [int(b) for b in sizes.split(",")]
json.dump(c, open(dst, "w"))
