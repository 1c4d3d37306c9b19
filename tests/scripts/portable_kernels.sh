#!/usr/bin/env bash
# A portable build's CPU kernels use AVX registers only inside their run-time-chosen
# versions (*.avx2, *.avx512f): the code every x86-64 CPU may run has none, so the binary
# cannot die with SIGILL on an older machine. Arguments: the kernels' object file(s).
set -euo pipefail
obj=""
for f in "$@"; do case "$f" in *kernels_cpu.c.o) obj=$f ;; esac; done
[ -n "$obj" ] || { echo "no kernels_cpu.c.o among: $*"; exit 1; }
bad=$(objdump -d --no-show-raw-insn "$obj" | awk '
  /^[0-9a-f]+ <.*>:$/ { fn = $2; next }
  /%[yz]mm[0-9]/ && fn !~ /\.(avx2|avx512f)[.>]/ && fn !~ /\.(avx2|avx512f)>/ { print fn; }' |
  sort -u)
if [ -n "$bad" ]; then
  echo "AVX registers in code every CPU runs: $bad"
  exit 1
fi
clones=$(objdump -d "$obj" | grep -c '^[0-9a-f]* <.*\.avx2>:' || true)
echo "portable_kernels: baseline code has no AVX; $clones functions have AVX2 versions"
[ "$clones" -gt 0 ] || [ "$(uname -m)" != x86_64 ] || {
  echo "no AVX2 versions: the fast paths are missing"; exit 1; }
