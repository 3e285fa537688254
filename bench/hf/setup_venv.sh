#!/usr/bin/env bash
# setup_venv.sh: creates (or reuses) bench/hf/.venv with the pinned Python packages from
# bench/hf/requirements.txt: torch, transformers, safetensors, tokenizers, peft.
#
# torch is taken from the PyTorch CPU wheel index when that index is reachable (a CPU-only
# build, about 200 MB); otherwise it falls back to the same torch version from PyPI, whose
# Linux wheel also runs on CPU but pulls the CUDA runtime wheels (several GB) as dependencies.
# Set HF_VENV_NO_CPU_INDEX=1 to skip the CPU index attempt.
#
# Usage: bash bench/hf/setup_venv.sh        (then use bench/hf/.venv/bin/python)
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
venv=$here/.venv
req=$here/requirements.txt
cpu_index=https://download.pytorch.org/whl/cpu
py=${PYTHON:-python3}

if [[ ! -x "$venv/bin/python" ]]; then
  echo "setup_venv: creating $venv"
  "$py" -m venv "$venv"
else
  echo "setup_venv: reusing $venv"
fi
pip=("$venv/bin/python" -m pip)

torch_pin=$(grep -E '^torch==' "$req" | head -n1)
torch_ver=${torch_pin#torch==}
others=$(grep -vE '^\s*(#|$)' "$req" | grep -vE '^torch==')

# A venv that already has every pinned version is left alone.
if "$venv/bin/python" - "$req" <<'PY' 2>/dev/null; then
import sys, importlib.metadata as md
for line in open(sys.argv[1]):
    line = line.split('#', 1)[0].strip()
    if not line:
        continue
    name, ver = line.split('==')
    have = md.version(name)
    if have.split('+')[0] != ver:
        sys.exit(1)
PY
  echo "setup_venv: all pinned packages already installed"
  exit 0
fi

"${pip[@]}" install --quiet --upgrade pip

have_torch=$("$venv/bin/python" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)
if [[ "${have_torch%%+*}" != "$torch_ver" ]]; then
  installed=0
  if [[ "${HF_VENV_NO_CPU_INDEX:-0}" != 1 ]] &&
     "$venv/bin/python" -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/torch/", timeout=15)' \
       "$cpu_index" 2>/dev/null; then
    echo "setup_venv: installing torch==$torch_ver+cpu from the CPU index"
    "${pip[@]}" install --quiet --index-url "$cpu_index" --extra-index-url https://pypi.org/simple \
      "torch==$torch_ver+cpu" && installed=1
  fi
  if [[ $installed == 0 ]]; then
    echo "setup_venv: CPU index not reachable; installing torch==$torch_ver from PyPI (large download)"
    "${pip[@]}" install --quiet "torch==$torch_ver"
  fi
fi

echo "setup_venv: installing" $others
# shellcheck disable=SC2086
"${pip[@]}" install --quiet $others "torch==$torch_ver"

"$venv/bin/python" - <<'PY'
import torch, transformers, safetensors, tokenizers, peft
print("setup_venv: torch", torch.__version__, "transformers", transformers.__version__,
      "safetensors", safetensors.__version__, "tokenizers", tokenizers.__version__,
      "peft", peft.__version__)
PY
