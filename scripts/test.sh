#!/usr/bin/env bash
# Builds starling (dev preset: CPU, plus the CUDA backend when a toolkit is found) and runs the
# whole test suite. Usage: bash scripts/test.sh [preset]   (default: dev)
set -euo pipefail
cd "$(dirname "$0")/.."
preset="${1:-dev}"
bash scripts/deps.sh
cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
ctest --preset "$preset"
