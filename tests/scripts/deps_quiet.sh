#!/usr/bin/env bash
# scripts/deps.sh prints one line per step and keeps the tools' output in a log; a failing
# step prints the log's tail and its name. The tools are stand-ins on PATH that print as much
# as apt-get does (about 200 lines), so nothing is installed or built.
set -uo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
for tool in apt-get cmake; do
  cat > "$work/bin/$tool" <<TOOL
#!/bin/sh
for i in \$(seq 200); do echo "$tool line \$i"; done
[ -n "\${FAIL_TOOL:-}" ] && [ "\$FAIL_TOOL" = "$tool" ] && { echo "$tool: E: the last words"; exit 100; }
exit 0
TOOL
done
printf '#!/bin/sh\ncase "$2" in cmake|python3) exit 0;; esac\nexit 1\n' > "$work/bin/dpkg"
printf '#!/bin/sh\necho 0\n' > "$work/bin/id"
printf '#!/bin/sh\nexec "$@"\n' > "$work/bin/sudo"
chmod +x "$work/bin/"*
fails=0
check() { if ! eval "$1"; then echo "FAILED: $2"; fails=$((fails + 1)); fi; }

cd "$src"
run() { PATH="$work/bin:$PATH" BALLAST_BUILD="$work/build" bash -c \
  'set -euo pipefail; source scripts/deps.sh' > "$work/out" 2> "$work/err"; }

run; status=$?
check '[ $status -eq 0 ]' "deps.sh succeeds (status $status)"
lines=$(wc -l < "$work/out")
check '[ "$lines" -le 6 ]' "at most 6 lines on stdout, got $lines: $(head -c 600 "$work/out")"
check '[ ! -s "$work/err" ]' "nothing on stderr: $(head -c 600 "$work/err")"
check 'grep -q "apt-get line 200" "$work/build/deps.log"' "the log has apt-get's output"
check 'grep -q "cmake line 200" "$work/build/deps.log"' "the log has cmake's output"

FAIL_TOOL=apt-get run; status=$?
check '[ $status -ne 0 ]' "a failing apt-get fails deps.sh"
check 'grep -q "E: the last words" "$work/err"' "the failure shows the log's tail"
check 'grep -q "$work/build/deps.log" "$work/err"' "the failure names the log"
lines=$(cat "$work/out" "$work/err" | wc -l)
check '[ "$lines" -le 45 ]' "a failure prints the tail, not the whole log ($lines lines)"

[ $fails -eq 0 ] && echo "deps_quiet: all checks passed"
exit $fails
