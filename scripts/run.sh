#!/usr/bin/env bash
# The main job: builds the release binary, trains the CPU baby GPT on Tiny Shakespeare
# (configs/gpt_char_cpu.toml) and prints a sample from the checkpoint.
# Extra arguments go to `starling train`, e.g. --set train.max_iters=500.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target starling
bin=build/release/apps/starling
"$bin" train --config configs/gpt_char_cpu.toml "$@"
"$bin" sample --config configs/gpt_char_cpu.toml "$@"
