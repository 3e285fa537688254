#!/usr/bin/env bash
# The same federated task in Flower's simulation (Ray + PyTorch) and in `starling simulate`, in
# one run: MNIST 2NN (784-200-200-10), N clients with an IID partition, K per round, E=1, B=10,
# lr 0.1, R rounds of FedAvg. Prints wall time, peak memory (whole process tree) and final test
# accuracy of each. Usage: bash bench/flower_sim.sh [--clients N] [--per-round K] [--rounds R]
# Flower and CPU PyTorch live in a venv under build/ (never in the product).
set -euo pipefail
cd "$(dirname "$0")/.."
clients=100 per_round=10 rounds=20
while [[ $# -gt 0 ]]; do
  case "$1" in
    --clients) clients=$2; shift 2 ;;
    --per-round) per_round=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
venv=build/flower_venv
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import flwr, torch, ray, psutil" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q "flwr[simulation]" torch numpy psutil
fi
starling=${STARLING:-build/release/apps/starling}
if [[ ! -x "$starling" ]]; then
  bash scripts/deps.sh
  cmake --preset release >/dev/null
  cmake --build --preset release --target starling >/dev/null
fi
data_dir=${STARLING_DATA_DIR:-$(cd .. && pwd)/shared/data}
cpus=$(nproc)
out=build/flower_sim
rm -rf "$out"
mkdir -p "$out"

# starling: wall time around the whole command, peak RSS from the run's summary.json (VmHWM).
t0=$(date +%s.%N)
"$starling" --log-level warn simulate -c configs/sim_mnist_100.toml -q -o "$out/starling" \
  --workers "$cpus" --set data.num_clients="$clients" --set rounds.clients_per_round="$per_round" \
  --set rounds.num_rounds="$rounds" --set eval.every_rounds="$rounds" \
  --set data.data_dir="\"$data_dir\"" >/dev/null
t1=$(date +%s.%N)
ours=$(python3 -c "
import json; s = json.load(open('$out/starling/summary.json'))
print(json.dumps({'engine': 'starling simulate (in-process)', 'wall_seconds': $t1 - $t0,
                  'peak_rss_bytes': s['peak_rss_bytes'], 'test_accuracy': s['test_accuracy']}))")
theirs=$("$venv/bin/python" bench/flower_sim.py --data-dir "$data_dir" --clients "$clients" \
  --per-round "$per_round" --rounds "$rounds" --cpus "$cpus" 2>"$out/flower.log" | tail -1)
python3 - "$ours" "$theirs" "$clients" "$per_round" "$rounds" <<'PY'
import json, sys
a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"MNIST 2NN, {sys.argv[3]} clients (IID), {sys.argv[4]} per round, {sys.argv[5]} rounds, E=1, B=10, lr 0.1")
# Memory: starling's peak RSS (one process) against the peak of the summed PSS of Flower's
# process tree (driver and Ray processes, shared pages split between them); the summed RSS,
# which counts shared pages once per process, is printed beside it.
print(f"{'engine':<48}{'wall s':>9}{'peak MB':>10}{'(RSS sum)':>11}{'test acc':>10}")
a['peak_pss_bytes'] = a['peak_rss_bytes']
for r in (a, b):
    print(f"{r['engine']:<48}{r['wall_seconds']:>9.1f}{r['peak_pss_bytes'] / 1e6:>10.1f}"
          f"{r['peak_rss_bytes'] / 1e6:>11.1f}{r['test_accuracy']:>10.4f}")
print(f"starling vs flower: {b['wall_seconds'] / a['wall_seconds']:.1f}x faster, "
      f"{b['peak_pss_bytes'] / a['peak_rss_bytes']:.1f}x less memory")
PY
