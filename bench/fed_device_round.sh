#!/usr/bin/env bash
# A federated round on a device, as a user runs it: `starling certs` makes a CA and
# certificates, an aggregator and two `starling client --device DEVICE` processes train a tiny
# GPT (TASK=gpt, the default) or a tiny MNIST DDPM U-Net (TASK=ddpm) over mutual TLS on loopback
# (2 rounds, local AdamW), and each client prints the share of its round time spent outside
# training. The global model lands in OUT_DIR/state.
#   [TASK=ddpm] bash bench/fed_device_round.sh BUILD_DIR DEVICE OUT_DIR [GPUS]  (DEVICE: cpu or
#   cuda; GPUS, e.g. 0,1: each GPT client trains data parallel over them)
# bench/gpu_check.sh runs it for cpu and cuda and compares the two global models.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)
source scripts/lib/procs.sh
build=$1 device=$2 out=$3 gpus=${4:-}
bin="$build/apps/starling"
[[ -x "$bin" ]] || { echo "fed_device_round: no binary at $bin" >&2; exit 2; }
on_exit_kill_children ':'
rm -rf "$out"
mkdir -p "$out"
"$bin" --log-level warn certs init-ca --out "$out/ca" --name fed-device-round >/dev/null
"$bin" --log-level warn certs issue --ca "$out/ca" --name aggregator --role server \
  --san DNS:localhost,IP:127.0.0.1 --out "$out/certs" >/dev/null
for k in 0 1; do
  "$bin" --log-level warn certs issue --ca "$out/ca" --name "client-$k" --role client \
    --out "$out/certs" >/dev/null
done
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
# The task's data and model.
if [[ "${TASK:-gpt}" == ddpm ]]; then
  task_toml=$(cat <<TOML
[data]
dataset = "mnist"
partition = "IID"
num_clients = 2
data_dir = "$root/tests/fixtures/data"
[model]
arch = "DDPM"
local_optimizer = "ADAMW"
[model.ddpm]
base_channels = 8
channel_mult = [1, 2]
groups = 4
attention = true
timesteps = 100
sampling_steps = 4
num_samples = 4
TOML
)
else
  task_toml=$(cat <<TOML
[data]
dataset = "shakespeare"
partition = "ROLES"
num_clients = 2
min_role_chars = 20000
data_dir = "$root/tests/fixtures/data"
[model]
arch = "GPT"
n_layer = 2
n_head = 4
n_embd = 64
block_size = 64
local_optimizer = "ADAMW"
TOML
)
fi
# One config per node: the same federation, each node's own certificate.
write_config() {  # write_config NAME
  cat > "$out/$1.toml" <<TOML
[rounds]
num_rounds = 2
clients_per_round = 2
min_available = 2
[local]
local_steps = 10
batch_size = 8
learning_rate = 0.001
$task_toml
[eval]
every_rounds = 1
max_examples = 32
[server]
port = $port
state_dir = "$out/state"
[tls]
ca = "$out/certs/ca.crt"
cert = "$out/certs/$1.crt"
key = "$out/certs/$1.key"
[client]
server_port = $port
server_name = "localhost"
node_id = "$1"
state_path = "none"
TOML
}
for name in aggregator client-0 client-1; do write_config "$name"; done
"$bin" aggregator -c "$out/aggregator.toml" > "$out/aggregator.log" 2>&1 &
agg=$!
for _ in $(seq 200); do grep -q "listening" "$out/aggregator.log" 2>/dev/null && break; sleep 0.05; done
pids=()
for k in 0 1; do
  "$bin" client -c "$out/client-$k.toml" --partition "$k" --device "$device" \
    ${gpus:+--gpus "$gpus"} > "$out/client-$k.log" 2>&1 &
  pids+=($!)
done
# The clients first: one that fails (no GPU, a bad config) ends the run at once (the exit trap
# stops the aggregator) instead of leaving the aggregator waiting for it.
rc=0
for k in 0 1; do
  if ! wait "${pids[$k]}"; then
    echo "fed_device_round: client-$k failed:"
    tail -5 "$out/client-$k.log"
    exit 1
  fi
done
wait "$agg" || rc=$?
tail -3 "$out/aggregator.log"
for k in 0 1; do grep -E "rounds trained" "$out/client-$k.log" | tail -1; done
[[ $rc -eq 0 && -f "$out/state/global_model.safetensors" ]] || {
  echo "fed_device_round: failed (rc $rc); logs in $out"; exit 1; }
echo "fed_device_round: $device ok"
