#!/usr/bin/env bash
# Edge client footprint: peak RSS and time per round of `starling client` (a real client
# process over mutual TLS against a local aggregator) beside a Flower client (Python + PyTorch,
# bench/client_footprint.py) doing the same local work: MNIST 2NN and CNN, one IID partition of
# 100 (600 examples), E=1, B=10, lr 0.1, 3 rounds. Also the stripped binary size.
# Usage: bash bench/client_footprint.sh [--rounds R]   (STARLING=path/to/starling to choose the binary)
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=3
[[ "${1:-}" == "--rounds" ]] && rounds=$2
starling=${STARLING:-build/release/apps/starling}
if [[ ! -x "$starling" ]]; then
  bash scripts/deps.sh
  cmake --preset release >/dev/null
  cmake --build --preset release --target starling >/dev/null
fi
venv=build/flower_venv
if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import flwr, torch" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q flwr torch numpy
fi
data_dir=${STARLING_DATA_DIR:-$(cd .. && pwd)/shared/data}
work=$(mktemp -d)
# Every exit (done, failed, Ctrl-C) stops the servers this script started, even the ones
# started inside $(run_starling ...), and removes $work.
source "$(dirname "$0")/../scripts/lib/procs.sh"
on_exit_kill_children 'rm -rf "$work"'
"$starling" --log-level warn certs init-ca --out "$work/ca" --name footprint
"$starling" --log-level warn certs issue --ca "$work/ca" --name aggregator --role server \
  --san DNS:localhost,IP:127.0.0.1 --out "$work/agg"
"$starling" --log-level warn certs issue --ca "$work/ca" --name client-7 --role client --out "$work/c"

run_starling() {  # model arch -> "peak_mib seconds_per_round"
  local arch=$1 port=$((20000 + RANDOM % 12000))
  local common="[rounds]
num_rounds = $rounds
clients_per_round = 1
min_available = 1
[local]
epochs = 1
batch_size = 10
learning_rate = 0.1
[data]
dataset = \"mnist\"
data_dir = \"$data_dir\"
num_clients = 100
[model]
arch = \"$arch\"
[eval]
every_rounds = 0"
  printf '[tls]\nca = "%s"\ncert = "%s"\nkey = "%s"\n[server]\nport = %s\nstate_dir = "%s"\n%s\n' \
    "$work/agg/ca.crt" "$work/agg/aggregator.crt" "$work/agg/aggregator.key" "$port" \
    "$work/state_$arch" "$common" >"$work/agg.toml"
  printf '[tls]\nca = "%s"\ncert = "%s"\nkey = "%s"\n%s\n[client]\nserver_port = %s\nserver_name = "localhost"\npartition_index = 7\nstate_path = "none"\n' \
    "$work/c/ca.crt" "$work/c/client-7.crt" "$work/c/client-7.key" "$common" "$port" >"$work/client.toml"
  "$starling" --log-level warn aggregator --config "$work/agg.toml" >"$work/agg.log" 2>&1 &
  local agg_pid=$!
  sleep 0.5
  OMP_NUM_THREADS=1 /usr/bin/time -f "%M %e" -o "$work/time" \
    "$starling" --log-level warn client --config "$work/client.toml" >"$work/client.log" 2>&1
  wait "$agg_pid"
  read -r kb secs <"$work/time"
  awk -v kb="$kb" -v s="$secs" -v r="$rounds" 'BEGIN { printf "%.1f %.3f", kb / 1024, s / r }'
}

printf "\n%-8s | %-28s | %-28s | %s\n" "model" "starling client: peak RSS, s/round" \
  "Flower client: peak RSS, s/round" "RSS ratio"
printf -- "---------|------------------------------|------------------------------|----------\n"
for m in 2nn cnn; do
  arch=$([[ $m == cnn ]] && echo CNN || echo MLP)
  read -r s_rss s_sec <<<"$(run_starling "$arch")"
  read -r _ _ _ f_rss _ f_sec <<<"$("$venv/bin/python" bench/client_footprint.py --data-dir "$data_dir" \
    --model "$m" --rounds "$rounds")"
  printf "%-8s | %8s MiB, %8s s       | %8s MiB, %8s s       | %.1fx\n" "$m" "$s_rss" "$s_sec" \
    "$f_rss" "$f_sec" "$(awk -v a="$f_rss" -v b="$s_rss" 'BEGIN { print a / b }')"
done
stripped=$(mktemp)
strip -o "$stripped" "$starling"
printf "\nstarling binary (%s): %s bytes stripped\n" "$(uname -m)" "$(stat -c %s "$stripped")"
rm -f "$stripped"
