#!/usr/bin/env bash
# Training throughput, starling beside PyTorch eager (pip's current torch, CPU) in the same run,
# one table: the GPT step on starling's two engines (autograd, fused), the MDLM step on the same
# trunk (both engines), then the image models on their shipped configs' shapes (bench/
# image_throughput.cc beside bench/torch_image.py): DDPM U-Net, MNIST CNN, MNIST 2NN. Each row:
# ms/step, tokens or images per second, peak RSS (where the program reports it) and ours / PyTorch.
# Usage: bash bench/train_throughput.sh [--threads N] [GPT shape flags...] [-- image flags...]
# --threads N reaches every program; GPT shape flags (--vocab --block --layers --heads --embd
# --batch --warmup --steps) only the GPT and MDLM ones; flags after "--" (--batch --warmup --steps)
# only the image ones. Default GPT shape: the CPU baby GPT (V=65, T=64, L=4, H=4, C=128, B=12).
# Env: BUILD (default build/release, configured with the release preset when missing), VENV (a
# virtual environment with torch; default bench/.venv, made with pip's torch when missing),
# IMAGE_MODELS (default "ddpm cnn 2nn"; empty: no image rows), OPENBLAS_CORETYPE_KEEP (see below),
# REPEATS (default 3): the whole sequence runs that many times, ours and PyTorch's programs
# interleaved, and each row is the run with the median ms/step (a run on this 2-core machine
# varies by 10-20% from the next; within one run each program already takes the median step).
# Our programs run on the OpenBLAS kernels OpenBLAS picks for this CPU: an OPENBLAS_CORETYPE in the
# environment (this workplace sets Haswell, AVX2, on its AVX-512 Zen 5 machines) is removed for
# them unless OPENBLAS_CORETYPE_KEEP=1, and the table says which kernels ran. PyTorch does not
# use OpenBLAS for these products.
set -euo pipefail
if [[ -n "${OPENBLAS_CORETYPE:-}" && "${OPENBLAS_CORETYPE_KEEP:-0}" != 1 ]]; then
  echo "train_throughput.sh: OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE removed for our programs" \
    "(OPENBLAS_CORETYPE_KEEP=1 keeps it)" >&2
  unset OPENBLAS_CORETYPE
fi
cd "$(dirname "$0")/.."
build=${BUILD:-build/release}
venv=${VENV:-bench/.venv}
gpt_args=()
while [[ $# -gt 0 && $1 != -- ]]; do gpt_args+=("$1"); shift; done
[[ $# -gt 0 ]] && shift
image_args=("$@")
threads=()
for ((i = 0; i < ${#gpt_args[@]}; i++)); do
  case ${gpt_args[i]} in
    --threads) threads=(--threads "${gpt_args[i + 1]:?--threads needs a value}") ;;
    --threads=*) threads=("${gpt_args[i]}") ;;
  esac
done
image_args=(${threads[@]+"${threads[@]}"} ${image_args[@]+"${image_args[@]}"})
if [[ -z "${VENV:-}" && ! -x "$venv/bin/python" ]]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip
  "$venv/bin/pip" install -q torch numpy
fi
if [[ ! -x "$build/bench/train_throughput" ]]; then
  bash scripts/deps.sh
  cmake --preset release -B "$build" >/dev/null
fi
cmake --build "$build" --target train_throughput image_throughput >/dev/null
repeats=${REPEATS:-3}
if [[ ! $repeats =~ ^[1-9][0-9]*$ ]]; then
  echo "train_throughput.sh: REPEATS must be a positive integer, got '$repeats'" >&2
  exit 2
fi
rows=()
for ((round = 0; round < repeats; round++)); do
  for engine in autograd fused; do
    rows+=("$("$build/bench/train_throughput" --engine "$engine" ${gpt_args[@]+"${gpt_args[@]}"})")
  done
  rows+=("$("$venv/bin/python" bench/torch_gpt.py ${gpt_args[@]+"${gpt_args[@]}"})")
  # The masked diffusion LM's step on the same trunk (bidirectional, V + 1 embeddings).
  for engine in autograd fused; do
    rows+=("$("$build/bench/train_throughput" --model mdlm --engine "$engine" \
      ${gpt_args[@]+"${gpt_args[@]}"})")
  done
  rows+=("$("$venv/bin/python" bench/torch_gpt.py --mdlm ${gpt_args[@]+"${gpt_args[@]}"})")
  for model in ${IMAGE_MODELS-ddpm cnn 2nn}; do
    rows+=("$("$build/bench/image_throughput" --model "$model" ${image_args[@]+"${image_args[@]}"})")
    rows+=("$("$venv/bin/python" bench/torch_image.py --model "$model" \
      ${image_args[@]+"${image_args[@]}"})")
  done
done
python3 - "$repeats" "${rows[@]}" <<'PY'
import json, sys
runs = {}
for x in sys.argv[2:]:
    r = json.loads(x)
    runs.setdefault((r.get("model", "gpt"), r["engine"], r["threads"]), []).append(r)
# Each program's run with the median ms/step (the lower of the middle two for an even count).
rows = [sorted(v, key=lambda r: r["ms_per_step"])[(len(v) - 1) // 2] for v in runs.values()]
for r in rows:
    r.setdefault("model", "gpt")
    r["rate"], r["unit"] = ((r["tokens_per_s"], "tok/s") if "tokens_per_s" in r
                            else (r["samples_per_s"], "img/s"))
peer = {r["model"]: r for r in rows if r["engine"].startswith("pytorch")}
mb = lambda v: f"{v:.0f}" if v is not None else "-"
blas = sorted({r["blas"] for r in rows if "blas" in r})
print("our OpenBLAS kernels: " + ", ".join(blas))
print(f"each row: the median of {sys.argv[1]} runs, ours and PyTorch's interleaved")
print("ours / pytorch: speed = throughput ratio (> 1: ours faster), RSS = peak RSS ratio; "
      "start MB: RSS before the model is built (libraries, interpreter)")
print(f"{'model':<6}{'engine':<28}{'threads':>8}{'ms/step':>10}{'per second':>17}{'params':>10}"
      f"{'peak MB':>9}{'start MB':>9}{'speed':>7}{'RSS':>7}")
for r in rows:
    p = peer.get(r["model"])
    ours = not r["engine"].startswith("pytorch") and p is not None
    speed = f"{r['rate'] / p['rate']:.2f}x" if ours else ""
    rss = (f"{r['peak_rss_mb'] / p['peak_rss_mb']:.2f}x"
           if ours and "peak_rss_mb" in r and "peak_rss_mb" in p else "")
    print(f"{r['model']:<6}{r['engine']:<28}{r['threads']:>8}{r['ms_per_step']:>10.2f}"
          f"{r['rate']:>11.0f} {r['unit']:<5}{r['params']:>10}{mb(r.get('peak_rss_mb')):>9}"
          f"{mb(r.get('start_rss_mb')):>9}{speed:>7}{rss:>7}")
PY
