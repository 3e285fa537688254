#!/usr/bin/env bash
# One SecAgg+ round, starling beside Flower's SecAgg+ (pip flwr) at the same points, in one run:
# 100, 300 and 1000 clients, vectors of 100k and 1M integers, 10% dropping after the share stage.
# Usage: bash bench/secagg_bench.sh [secagg_bench arguments...]
# Flower lives in a venv under build/ (never in the product); points where Flower's round runs
# past --budget-s (default 600 s) print "> budget".
set -euo pipefail
cd "$(dirname "$0")/.."
venv=build/secagg_flower_venv
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import flwr" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r bench/secagg_flower_requirements.txt
fi
bash scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target secagg_bench >/dev/null
build/release/bench/secagg_bench --python "$venv/bin/python" "$@"
