#!/usr/bin/env bash
# agg_bench.sh: creates build/agg_bench_venv (numpy from PyPI) when missing, then runs agg_bench
# with that python as the Flower-style peer. Usage: bench/agg_bench.sh [agg_bench options]
#   AGG_BENCH=path/to/agg_bench overrides the binary (default: build/dev/bench/agg_bench).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
venv=$root/build/agg_bench_venv
if ! "$venv/bin/python" -c "import numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet numpy
fi
bin=${AGG_BENCH:-$root/build/dev/bench/agg_bench}
if [[ ! -x $bin ]]; then
  echo "agg_bench.sh: $bin not built (cmake --build build/dev --target agg_bench), or set AGG_BENCH" >&2
  exit 1
fi
cd "$root"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
exec "$bin" --python "$venv/bin/python" --peer "$root/bench/agg_bench.py" \
  --spill-dir "$root/build/agg_bench_spill" "$@"
