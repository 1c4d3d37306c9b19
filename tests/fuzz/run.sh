#!/bin/sh
# run.sh TARGET SEEDS CORPUS ARTIFACTS [libFuzzer options...]: runs a fuzz target on a fresh
# copy of its corpus (CORPUS, emptied first: runs are reproducible), starting from SEEDS (read,
# never written); a crash input lands in ARTIFACTS. LeakSanitizer is told about the
# libraries' own allocations that live until exit (tests/sanitizers/lsan.supp).
target=$1 seeds=$2 corpus=$3 artifacts=$4
shift 4
here=$(dirname "$0")
rm -rf "$corpus"
mkdir -p "$corpus" "$artifacts" || exit 1
LSAN_OPTIONS="suppressions=$here/../sanitizers/lsan.supp:print_suppressions=0" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  exec "$target" -artifact_prefix="$artifacts/$(basename "$target")-" -timeout=10 \
  -rss_limit_mb=2048 -print_final_stats=1 "$@" "$corpus" "$seeds"
