#!/usr/bin/env bash
# Sampling speed with and without the KV cache: starling's GPT generate and block-diffusion MDLM
# sampler (bench/sample_bench.cc), then PyTorch eager nanoGPT-style generate on the same GPT
# shapes (bench/torch_sample.py: no cache, as nanoGPT, and with a KV cache), one thread each.
# Usage: bash bench/sample_bench.sh [--threads N] [--gpt2-new N] [--char-new N]
# Env: BUILD (default build/release; configured with the release preset when missing),
# VENV (a virtual environment with torch; default bench/.venv, made with pip's torch when
# missing; a VENV without torch skips the PyTorch rows).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build/release}
venv=${VENV:-bench/.venv}
threads=1 char_new=255 gpt2_new=64
while [[ $# -gt 0 ]]; do
  case "$1" in
    --threads) threads=$2; shift 2 ;;
    --char-new) char_new=$2; shift 2 ;;
    --gpt2-new) gpt2_new=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
export OMP_NUM_THREADS=$threads
if [[ -z "${VENV:-}" && ! -x "$venv/bin/python" ]]; then  # the peer, as train_throughput.sh
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q torch numpy
fi
if [[ ! -f "$build/CMakeCache.txt" ]]; then
  cmake --preset release -B "$build" >/dev/null
fi
cmake --build "$build" --target sample_bench -j2 >/dev/null
echo "== starling (threads $threads)"
"$build/bench/sample_bench" --threads "$threads" --char-new "$char_new" --gpt2-new "$gpt2_new"
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import torch" 2>/dev/null; then
  echo "== pytorch eager (threads $threads)"
  "$venv/bin/python" bench/torch_sample.py --threads "$threads" --new "$char_new"
  if [[ "$gpt2_new" -gt 0 ]]; then
    "$venv/bin/python" bench/torch_sample.py --threads "$threads" --new "$gpt2_new" \
      --vocab 50257 --block 1024 --layers 12 --heads 12 --embd 768
  fi
else
  echo "== pytorch: no torch in $venv (set VENV), skipped"
fi
