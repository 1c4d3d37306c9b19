# Sourced by the set-up scripts: installs the Debian packages Ballast needs that are missing,
# then the PyPI packages Debian lacks (profiler/torch/requirements.txt: transformers for
# `python3 -m profiler.torch --hf`, for /usr/bin/python3), then configures and builds into
# build/ (BALLAST_BUILD overrides the folder; the array cmake_args, if the caller set one,
# adds configure options). Each step prints one line; its full output goes to
# $build/deps.log, whose tail is printed if the step fails.
# clang, libclang-rt-dev and libomp-dev: the libFuzzer build (tests/fuzz); strace: the test
# that counts how often each input is opened (tests/test_inputs.c).
packages=(build-essential cmake pkg-config libopenmpi-dev openmpi-bin libglpk-dev
          libcunit1-dev libcjson-dev libyaml-dev libopenblas-dev gnuplot-nox python3 python3-torch
          python3-pip python3-numpy python3-yaml python3-regex python3-requests python3-tqdm
          python3-filelock python3-packaging python3-typing-extensions
          clang libclang-rt-dev libomp-dev strace)
build=${BALLAST_BUILD:-build}
mkdir -p "$build"
deps_log="$build/deps.log"
: > "$deps_log"

# deps_step "what it does" command...: one line, the output to the log.
deps_step() {
  local what=$1
  shift
  echo "-- $what"
  echo "== $what: $*" >> "$deps_log"
  if ! "$@" >> "$deps_log" 2>&1; then
    echo "FAILED: $what; the last lines of $deps_log:" >&2
    tail -n 30 "$deps_log" >&2
    echo "(full output: $deps_log)" >&2
    return 1
  fi
}

missing=()
for p in "${packages[@]}"; do
  dpkg -s "$p" > /dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo=sudo
  deps_step "apt-get update" $sudo apt-get update
  deps_step "installing ${missing[*]}" $sudo env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y --no-install-recommends "${missing[@]}"
fi
# The pinned PyPI packages, unless each is installed at its version already (pip then leaves
# Debian's packages alone: the pins need nothing newer). Root installs into /usr/local, the
# place Debian keeps for it; anyone else into their user site.
pypi_missing() {
  /usr/bin/python3 - profiler/torch/requirements.txt <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
for line in open(sys.argv[1]):
    name, sep, want = line.split("#")[0].strip().partition("==")
    try:
        have = version(name) if sep else want
    except PackageNotFoundError:
        have = None
    if have != want:
        sys.exit(0)
sys.exit(1)
PY
}
if pypi_missing; then
  pip_where=(--user)
  [ "$(id -u)" -eq 0 ] && pip_where=(--root-user-action=ignore)
  deps_step "installing profiler/torch/requirements.txt from PyPI" \
    env PIP_DISABLE_PIP_VERSION_CHECK=1 /usr/bin/python3 -m pip install \
    --break-system-packages --no-warn-script-location "${pip_where[@]}" \
    -r profiler/torch/requirements.txt
fi
deps_step "configuring $build" cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  ${cmake_args[@]+"${cmake_args[@]}"}
deps_step "building $build (log: $deps_log)" cmake --build "$build" -j "$(nproc)"
