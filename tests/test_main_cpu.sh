#!/usr/bin/env bash
# The main job's CPU path without the training: measure GPT-tiny here (one thread, one
# sample), write this machine's cluster with scripts/cpu-cluster.sh, and plan it with the
# measured profile. Checks: one stage per core (at least 2, at most one per layer), stage 0's
# limit too small to keep everything (method none exits 3) yet enough for the optimal plan,
# which recomputes something; no thread warning for a one-thread profile, and one per stage
# for a profile measured with more threads than a rank gets.
# usage: tests/test_main_cpu.sh PATH/TO/ballast   (from the source tree)
set -euo pipefail
ballast=${1:?usage: $0 PATH/TO/ballast}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
field() { python3 -c "import json, sys; d = json.load(open(sys.argv[1])); print($2)" "$1"; }

"$ballast" profile --model configs/models/gpt-tiny.json --device cpu --threads 1 --repeats 1 \
  -o "$tmp/profile.json" 2> /dev/null
scripts/cpu-cluster.sh "$ballast" "$tmp/profile.json" "$tmp/cluster.json"
cores=$(nproc)
want=$(( cores > 2 ? cores : 2 ))
want=$(( want < 8 ? want : 8 )) # GPT-tiny has 8 layers
[ "$(field "$tmp/cluster.json" 'len(d["stages"])')" = "$want" ] || fail "not $want stages"

rc=0
"$ballast" plan --cluster "$tmp/cluster.json" --method none --quiet 2> "$tmp/none.err" || rc=$?
[ "$rc" = 3 ] || fail "keeping everything fits stage 0 (plan --method none: exit $rc)"
grep -q "stage 0" "$tmp/none.err" || fail "method none does not name stage 0"
"$ballast" plan --cluster "$tmp/cluster.json" --quiet -o "$tmp/plan.json" 2> "$tmp/plan.err"
[ ! -s "$tmp/plan.err" ] || fail "plan printed: $(cat "$tmp/plan.err")"
[ "$(field "$tmp/plan.json" \
      'len(d["stages"][0]["recompute"]) + len(d["stages"][0].get("recompute_options", []))')" \
  != 0 ] || fail "stage 0 recomputes nothing"

# explicit stage counts
scripts/cpu-cluster.sh "$ballast" "$tmp/profile.json" "$tmp/cluster3.json" 3
[ "$(field "$tmp/cluster3.json" 'len(d["stages"])')" = 3 ] || fail "STAGES=3 not honoured"
scripts/cpu-cluster.sh "$ballast" "$tmp/profile.json" "$tmp/cluster20.json" 20
[ "$(field "$tmp/cluster20.json" 'len(d["stages"])')" = 8 ] || fail "more stages than layers"

# a profile that ran more threads than a rank gets: one warning per stage, naming the numbers
python3 - "$tmp/profile.json" "$tmp/two.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["provenance"].update(threads=2, cores_online=2)
json.dump(p, open(sys.argv[2], "w"))
PY
scripts/cpu-cluster.sh "$ballast" "$tmp/two.json" "$tmp/cluster-two.json" 2
"$ballast" plan --cluster "$tmp/cluster-two.json" --quiet 2> "$tmp/two.err"
[ "$(grep -c 'profile two.json was measured with 2 threads, but a rank gets 1' "$tmp/two.err")" \
  = 2 ] || fail "no warning per stage: $(cat "$tmp/two.err")"

# an estimated profile is refused: the cluster is for a profile measured here
if scripts/cpu-cluster.sh "$ballast" configs/profiles/estimated/gpt-tiny/cpu.json \
     "$tmp/est.json" 2> /dev/null; then
  fail "an estimated profile was taken"
fi
echo "main job's CPU cluster and plan: ok"
