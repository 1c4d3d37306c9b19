#!/usr/bin/env bash
# Every test: install what is missing, build, run the CTest suite.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
ctest --test-dir "$build" --output-on-failure
