#!/usr/bin/env bash
# Training throughput, starling's two engines (autograd, fused) beside PyTorch (pip's current
# CPU torch) on the same shape in the same run, then the MDLM step (both engines) beside PyTorch's.
# Usage: bash bench/train_throughput.sh [--threads N] [shape flags...]
# Default shape: the CPU baby GPT (V=65, T=64, L=4, H=4, C=128, B=12).
set -euo pipefail
cd "$(dirname "$0")/.."
venv=bench/.venv
if [[ ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q torch numpy
fi
if [[ ! -x build/release/bench/train_throughput ]]; then
  bash scripts/deps.sh
  cmake --preset release >/dev/null
fi
cmake --build --preset release --target train_throughput >/dev/null
ours=$(build/release/bench/train_throughput --engine autograd "$@")
fused=$(build/release/bench/train_throughput --engine fused "$@")
theirs=$("$venv/bin/python" bench/torch_gpt.py "$@")
# The masked diffusion LM's step on the same trunk (bidirectional, V + 1 embeddings).
ours_mdlm=$(build/release/bench/train_throughput --model mdlm --engine autograd "$@")
fused_mdlm=$(build/release/bench/train_throughput --model mdlm --engine fused "$@")
theirs_mdlm=$("$venv/bin/python" bench/torch_gpt.py --mdlm "$@")
python3 - "$ours" "$fused" "$theirs" "$ours_mdlm" "$fused_mdlm" "$theirs_mdlm" <<'PY'
import json, sys
a, f, b, am, fm, bm = (json.loads(x) for x in sys.argv[1:7])
print(f"{'model':<6}{'engine':<22}{'threads':>8}{'ms/step':>10}{'tokens/s':>12}{'params':>10}")
for r in (a, f, b, am, fm, bm):
    print(f"{r.get('model', 'gpt'):<6}{r['engine']:<22}{r['threads']:>8}{r['ms_per_step']:>10.2f}"
          f"{r['tokens_per_s']:>12.0f}{r['params']:>10}")
for r, peer in ((a, b), (f, b), (am, bm), (fm, bm)):
    print(f"{r.get('model', 'gpt')} {r['engine']} / pytorch: {r['tokens_per_s'] / peer['tokens_per_s']:.2f}x")
PY
