#!/usr/bin/env bash
# Regenerates the estimated profiles that the shipped clusters use, from configs/models and
# configs/devices.json: configs/profiles/estimated/<model>/<device>.json.
# usage: configs/make-profiles.sh PATH/TO/ballast [OUTDIR]
set -euo pipefail
ballast=${1:?usage: $0 PATH/TO/ballast [OUTDIR]}
here=$(cd "$(dirname "$0")" && pwd)
out=${2:-$here/profiles/estimated}
# every estimated profile a shipped cluster names (measured ones are made on their device)
python3 - "$here/clusters" <<'PY' | sort -u | while read -r model device; do
import json, os, sys
d = sys.argv[1]
for f in sorted(os.listdir(d)):
    if f.endswith(".json"):
        for s in json.load(open(os.path.join(d, f)))["stages"]:
            parts = s["profile"].split("/")
            if len(parts) >= 3 and parts[-3] == "estimated":
                print(parts[-2], parts[-1][:-len(".json")])
PY
  mkdir -p "$out/$model"
  "$ballast" profile --model "$here/models/$model.json" --estimate --device "$device" \
    --devices "$here/devices.json" -o "$out/$model/$device.json"
done
