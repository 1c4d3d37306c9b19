#!/usr/bin/env bash
# Every test: install what is missing, build (warnings are errors here), run the CTest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake_args=(-DBALLAST_WERROR=ON)
source scripts/deps.sh
ctest --test-dir "$build" --output-on-failure
