#!/usr/bin/env bash
# The main job: builds the release binary and runs `starling simulate`, a whole federation on
# this machine (Tiny Shakespeare split by speaking role, a char GPT trained by 141 clients, 2 a
# round, with int8 updates, then the same model centrally for comparison), then prints a sample
# from the federated model.
#   bash scripts/run.sh            # the federation (about a minute and a half on 2 cores)
#   bash scripts/run.sh gpt        # instead: train the CPU baby GPT centrally and sample it
# Further arguments go to the starling command, e.g. --set rounds.num_rounds=10.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/deps.sh
# The CUDA backend only where a GPU is: a binary linked to cuBLAS starts at about 230 MB of
# resident memory before it does anything, more than this whole CPU federation needs.
cuda=OFF
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then cuda=AUTO; fi
cmake --preset release -DSTARLING_CUDA="$cuda" >/dev/null
cmake --build --preset release --target starling
bin=build/release/apps/starling
# Both default runs need only Tiny Shakespeare. Without a data directory (no data_dir, no
# $STARLING_DATA_DIR, no ../shared/data) they use the copy in the repository: the whole file,
# checked against the upstream SHA-256 here (the MNIST cuts beside it are too small to measure
# anything with, so only this file is used).
if [[ -z "${STARLING_DATA_DIR:-}" && ! -f ../shared/data/tinyshakespeare/input.txt ]]; then
  shipped=tests/fixtures/data
  want=86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed
  got=$(sha256sum "$shipped/tinyshakespeare/input.txt" | cut -d' ' -f1)
  if [[ "$got" != "$want" ]]; then
    echo "run.sh: $shipped/tinyshakespeare/input.txt has SHA-256 $got, expected $want" >&2
    exit 1
  fi
  echo "run.sh: no data directory found; using the Tiny Shakespeare shipped in $shipped (SHA-256 ok)"
  export STARLING_DATA_DIR="$PWD/$shipped"
fi
if [[ "${1:-}" == "gpt" ]]; then
  shift
  "$bin" train --config configs/gpt_char_cpu.toml "$@"
  "$bin" sample --config configs/gpt_char_cpu.toml
  exit 0
fi
"$bin" simulate -o runs/sim_default "$@"
"$bin" sample runs/sim_default/model.safetensors -n 300
