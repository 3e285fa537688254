#!/usr/bin/env bash
# codec_bench.sh: creates bench/.venv (numpy and torch from PyPI) when missing, then runs
# codec_bench with that python as the peer. Usage: bench/codec_bench.sh [--scale 0.1] [--reps 3]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/bench/.venv
if ! "$venv/bin/python" -c "import numpy, torch" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet numpy torch
fi
bin=${CODEC_BENCH:-$root/build/cpu/bench/codec_bench}
if [[ ! -x $bin ]]; then
  echo "codec_bench.sh: $bin not built (cmake --preset cpu && cmake --build build/cpu --target codec_bench), or set CODEC_BENCH" >&2
  exit 1
fi
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1
exec "$bin" --python "$venv/bin/python" --peer "$root/bench/codec_peer.py" "$@"
