# Shared by the benches that plan shipped GPU clusters with host memory (host_optimizer.sh,
# weights.sh); source it after setting ballast, root, tmp and host_gib.
# The cluster with the model's estimated profiles, no layer ranges, host memory per stage.
make_cluster() {
  local name=$1 model=$2 dst=$3
  for device in $(python3 -c "import json,sys; print(' '.join(sorted({s['device'] for s in json.load(open(sys.argv[1]))['stages']})))" "$root/configs/clusters/$name.json"); do
    local prof="$root/configs/profiles/estimated/$model/$device.json"
    if [ ! -f "$prof" ] && [ ! -f "$tmp/$model-$device.json" ]; then
      "$ballast" profile --model "$root/configs/models/$model.json" --estimate --device "$device" \
        -o "$tmp/$model-$device.json" >/dev/null
    fi
  done
  python3 - "$root" "$name" "$model" "$tmp" "$host_gib" "$dst" <<'PY'
import json, os, sys
root, name, model, tmp, gib, dst = sys.argv[1:7]
c = json.load(open(os.path.join(root, "configs/clusters", name + ".json")))
for s in c["stages"]:
    p = os.path.join(root, "configs/profiles/estimated", model, s["device"] + ".json")
    s["profile"] = p if os.path.exists(p) else os.path.join(tmp, "%s-%s.json" % (model, s["device"]))
    s.pop("layers", None)
    s["host_memory_bytes"] = int(gib) << 30
json.dump(c, open(dst, "w"))
PY
}
