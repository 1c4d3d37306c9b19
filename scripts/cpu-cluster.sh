#!/usr/bin/env bash
# Writes a cluster of this machine's CPU for a measured profile: as many stages as the machine
# runs without oversubscription (one per core, one thread each, at least 2, at most one per
# layer of the model), the layers split
# evenly, 1F1B over 8 micro-batches. Stage 0 gets 90% of what keeping every activation needs
# (at least what recomputing every layer needs), so that its plan must recompute something;
# the others what keeping everything needs, rounded up to 8 MiB.
# usage: scripts/cpu-cluster.sh PATH/TO/ballast PROFILE.json OUT_CLUSTER.json [STAGES]
set -euo pipefail
ballast=${1:?usage: $0 PATH/TO/ballast PROFILE.json OUT_CLUSTER.json [STAGES]}
profile=${2:?usage: $0 PATH/TO/ballast PROFILE.json OUT_CLUSTER.json [STAGES]}
cluster=${3:?usage: $0 PATH/TO/ballast PROFILE.json OUT_CLUSTER.json [STAGES]}
cores=$(nproc)
stages=${4:-$(( cores > 2 ? cores : 2 ))}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# write CLUSTER with every stage's limit the host's memory, or LIMITS (comma-separated) if given
write() {
  python3 - "$profile" "$1" "$stages" "${2:-}" <<'PY'
import json, os, sys
profile, out, stages, limits = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
p = json.load(open(profile))
if p.get("estimated", True) or p["device"]["kind"] != "cpu":
    sys.exit(f"cpu-cluster: {profile}: expected a profile measured on a CPU")
host = p["device"]["memory_bytes"]
stages = min(stages, len(p["layers"]))
rel = os.path.relpath(os.path.abspath(profile), os.path.dirname(os.path.abspath(out)))
c = {"format": "ballast-cluster/1", "name": f"cpu-{stages}-here",
     "description": f"{stages} CPU ranks of this machine ({p['provenance'].get('cores_online')} "
                    f"cores), one thread each, with the profile measured here; stage 0 gets "
                    f"too little memory to keep every activation, so it recomputes",
     "schedule": "1f1b", "micro_batches": 8,
     "stages": [{"device": p["device"]["name"], "memory_bytes": host, "profile": rel}
                for _ in range(stages)]}
for s, limit in enumerate(limits.split(",") if limits else []):
    c["stages"][s]["memory_bytes"] = int(limit)
json.dump(c, open(out, "w"), indent=2)
PY
}

write "$tmp/roomy.json"
"$ballast" plan --cluster "$tmp/roomy.json" --method none --quiet -o "$tmp/none.json"
"$ballast" plan --cluster "$tmp/roomy.json" --method full --quiet -o "$tmp/full.json"
limits=$(python3 - "$tmp/none.json" "$tmp/full.json" <<'PY'
import json, sys
none, full = ([s["memory_bytes"] for s in json.load(open(f))["stages"]] for f in sys.argv[1:])
MiB = 1 << 20
limits = [max(full[0], none[0] * 9 // 10) // MiB * MiB]
limits += [-(-n // (8 * MiB)) * 8 * MiB for n in none[1:]]
print(",".join(map(str, limits)))
PY
)
write "$cluster" "$limits"
