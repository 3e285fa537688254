#!/usr/bin/env bash
# The ARM64 edge build, end to end on an x86-64 Debian 12 machine:
#   1. cross-compile the `arm64` preset (Debian's aarch64 toolchain, multiarch libraries);
#   2. run its test preset under qemu-aarch64 (engine, codecs, wire, transport, federation);
#   3. a federated round: an x86-64 `starling aggregator` and the cross-built `starling client`
#      (under qemu) over mutual TLS on loopback, with certificates from `starling certs`;
#   4. package it: starling_<version>_arm64.deb and the tarball, and report the binary size.
# Usage: bash scripts/arm64_check.sh [--skip-tests]
set -euo pipefail
cd "$(dirname "$0")/.."

skip_tests=0
[[ "${1:-}" == "--skip-tests" ]] && skip_tests=1

bash scripts/deps.sh --arm64
cmake --preset arm64 >/dev/null
cmake --build --preset arm64
if ((!skip_tests)); then
  ctest --preset arm64
fi

# The x86-64 side: $STARLING_HOST, else the dev build's binary (brought up to date here).
host_bin=${STARLING_HOST:-}
if [[ -z "$host_bin" ]]; then
  cmake --preset dev >/dev/null
  cmake --build build/dev --target starling
  host_bin=$PWD/build/dev/apps/starling
fi
arm_bin=$PWD/build/arm64/apps/starling
file "$arm_bin" | grep -q "ARM aarch64" || { echo "arm64_check: $arm_bin is not an aarch64 binary" >&2; exit 1; }

work=$(mktemp -d)
# Every exit (done, failed, Ctrl-C) stops the aggregator and removes $work.
source scripts/lib/procs.sh
on_exit_kill_children 'rm -rf "$work"'
"$host_bin" --log-level warn certs init-ca --out "$work/ca" --name arm64-check
"$host_bin" --log-level warn certs issue --ca "$work/ca" --name aggregator --role server \
  --san DNS:localhost,IP:127.0.0.1 --out "$work/agg"
"$host_bin" --log-level warn certs issue --ca "$work/ca" --name arm-client --role client \
  --out "$work/client"
port=$((20000 + RANDOM % 12000))  # below the ephemeral ports (32768 and up)
common="[rounds]
num_rounds = 2
clients_per_round = 1
min_available = 1
round_deadline_ms = 120000
[local]
local_steps = 20
batch_size = 10
learning_rate = 0.1
codec = \"topk:ratio=0.1,ef=1\"
[data]
dataset = \"mnist\"
num_clients = 100
[model]
hidden = 200
[eval]
every_rounds = 2
max_examples = 1000"
cat >"$work/agg.toml" <<TOML
[tls]
ca = "$work/agg/ca.crt"
cert = "$work/agg/aggregator.crt"
key = "$work/agg/aggregator.key"
[server]
port = $port
state_dir = "$work/state"
$common
TOML
cat >"$work/client.toml" <<TOML
[tls]
ca = "$work/client/ca.crt"
cert = "$work/client/arm-client.crt"
key = "$work/client/arm-client.key"
$common
[client]
server_port = $port
server_name = "localhost"
partition_index = 7
state_path = "$work/arm-client.state.safetensors"
TOML
"$host_bin" aggregator --config "$work/agg.toml" >"$work/agg.log" 2>&1 &
agg_pid=$!
for _ in $(seq 100); do grep -q listening "$work/agg.log" 2>/dev/null && break; sleep 0.1; done
echo "== x86-64 aggregator on port $port; ARM64 client under $(command -v qemu-aarch64)"
qemu-aarch64 "$arm_bin" client --config "$work/client.toml" --check
qemu-aarch64 "$arm_bin" client --config "$work/client.toml"
wait "$agg_pid"
grep -E "round 2|done after" "$work/agg.log"
echo "== the ARM64 client finished 2 federated rounds against the x86-64 aggregator"

(cd build/arm64 && cpack -G "DEB;TGZ" >/dev/null)
stripped=$(mktemp)
aarch64-linux-gnu-strip -o "$stripped" "$arm_bin"
printf "ARM64 starling binary: %s bytes stripped (%s unstripped)\n" \
  "$(stat -c %s "$stripped")" "$(stat -c %s "$arm_bin")"
rm -f "$stripped"
ls -l build/arm64/starling_*_arm64.deb build/arm64/starling-*-linux-aarch64.tar.gz
