#!/usr/bin/env bash
# The main job: builds the release binary and runs `starling simulate`, a whole federation on
# this machine (Tiny Shakespeare split by speaking role, a char GPT trained by 141 clients with
# top-k compressed updates over real mutual TLS), then prints a sample from the federated model.
#   bash scripts/run.sh            # the federation (about a minute on 2 cores)
#   bash scripts/run.sh gpt        # instead: train the CPU baby GPT centrally and sample it
# Further arguments go to the starling command, e.g. --set rounds.num_rounds=10.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release --target starling
bin=build/release/apps/starling
if [[ "${1:-}" == "gpt" ]]; then
  shift
  "$bin" train --config configs/gpt_char_cpu.toml "$@"
  "$bin" sample --config configs/gpt_char_cpu.toml
  exit 0
fi
"$bin" simulate -o runs/sim_default "$@"
"$bin" sample runs/sim_default/model.safetensors -n 300
