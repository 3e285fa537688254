#!/usr/bin/env bash
# examples/cpp_client against an installed prefix, not the build tree: `cmake --install` of the
# build into a temporary prefix, the example configured with find_package(starling) from there
# (its compile lines must not name the source or build tree), then a federation over mutual TLS
# of the installed `starling aggregator` and two cpp_client processes training their own C++
# model, and the same federation simulated by the example through sim/federate.h.
# Usage: cpp_client_test.sh BUILD_DIR SOURCE_DIR
set -euo pipefail
build=$(cd "$1" && pwd)
src=$(cd "$2" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/starling_install.XXXXXX")
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  for f in "$work"/*.log; do [[ -f $f ]] && { echo "== $f" >&2; tail -30 "$f" >&2; }; done
  exit 1
}

cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
# Everything lands under the prefix: nothing with an absolute destination of its own.
if grep -v "^$work/prefix/" "$build/install_manifest.txt" | grep -q .; then
  fail "cmake --install wrote outside the prefix: $(grep -v "^$work/prefix/" "$build/install_manifest.txt" | head -3)"
fi
[[ -f $work/prefix/lib/cmake/starling/starlingConfig.cmake ]] || fail "no CMake package installed"
[[ -f $work/prefix/include/starling/sim/federate.h ]] || fail "no headers installed"
[[ -f $work/prefix/include/starling/core/wire/messages.pb.h ]] || fail "no generated headers"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# A sanitizer build's libraries need the same flags in the program that links them.
cmake -S "$src/examples/cpp_client" -B "$work/build" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CXX_FLAGS="${STARLING_EXAMPLE_CXX_FLAGS:-}" \
  -DCMAKE_EXE_LINKER_FLAGS="${STARLING_EXAMPLE_LINKER_FLAGS:-}" >"$work/configure.log" 2>&1 ||
  fail "configuring examples/cpp_client"
cmake --build "$work/build" >"$work/build.log" 2>&1 || fail "building examples/cpp_client"
if grep -rqs -e "-I$src" -e "-isystem $src" -e "$build" "$work/build/build.ninja" "$work/build/CMakeFiles" 2>/dev/null; then
  fail "the example's build names the source or build tree, not the prefix"
fi
client="$work/build/cpp_client"
starling="$work/prefix/bin/starling"

# A PKI, the initial model, and one federation config shared by the aggregator and clients.
"$starling" --log-level warn certs init-ca --out "$work/ca" --name install-test
"$starling" --log-level warn certs issue --ca "$work/ca" --name aggregator --role server \
  --san DNS:localhost,IP:127.0.0.1 --out "$work/agg"
for k in 0 1; do
  "$starling" --log-level warn certs issue --ca "$work/ca" --name "client-$k" --role client \
    --out "$work/c$k"
done
"$client" init "$work/w.safetensors"
port=$((20000 + ($$ + 3313) % 12000))  # below the ephemeral ports (32768 and up)
common="[rounds]
num_rounds = 4
clients_per_round = 2
min_available = 2
round_deadline_ms = 20000
[local]
local_steps = 20
batch_size = 16
learning_rate = 0.1
codec = \"topk:ratio=0.6,ef=1\"
[data]
num_clients = 2
[model]
arch = \"EXTERNAL\"
weights = \"$work/w.safetensors\"
[eval]
every_rounds = 0
"
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
for k in 0 1; do
  cat >"$work/client-$k.toml" <<TOML
[tls]
ca = "$work/c$k/ca.crt"
cert = "$work/c$k/client-$k.crt"
key = "$work/c$k/client-$k.key"
$common
[client]
server_port = $port
server_name = "localhost"
backoff_max_ms = 300
state_path = "$work/client-$k.state"
TOML
done
"$starling" aggregator --config "$work/agg.toml" >"$work/agg.log" 2>&1 &
pids+=($!)
agg=$!
for _ in $(seq 100); do grep -q listening "$work/agg.log" 2>/dev/null && break; sleep 0.1; done
grep -q listening "$work/agg.log" || fail "the aggregator did not start"
for k in 0 1; do
  "$client" run "$work/client-$k.toml" "$k" >"$work/client-$k.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]:1}"; do wait "$p" || fail "a cpp_client exited with an error"; done
wait "$agg" || fail "the aggregator exited with an error"
grep -q "federation complete after 4 rounds" "$work/agg.log" || fail "the federation did not complete"
for k in 0 1; do
  grep -q "cpp_client: 4 rounds trained" "$work/client-$k.log" || fail "client-$k did not train 4 rounds"
done
# The federated model learned: the initial zeros have an MSE of about 5 on this data.
mse=$("$client" eval "$work/state/global_model.safetensors" | awk '{print $2}')
awk -v m="$mse" 'BEGIN { exit !(m < 0.05) }' || fail "federated model's MSE $mse is not below 0.05"
echo "federation over mutual TLS: 4 rounds, MSE $mse"

# The same federation simulated by the example (in process, then over loopback TLS).
for mode in IN_PROCESS LOOPBACK; do
  printf '%s[simulate]\nmode = "%s"\n' "$common" "$mode" >"$work/sim.toml"
  out=$("$client" simulate "$work/sim.toml" "$work/sim_$mode" 2>"$work/sim_$mode.log") ||
    fail "cpp_client simulate ($mode)"
  echo "$out" | grep -q "4 rounds" || fail "simulation ($mode): $out"
  smse=$(echo "$out" | sed -n 's/.*mse \([0-9.]*\).*/\1/p')
  awk -v m="$smse" 'BEGIN { exit !(m < 0.05) }' || fail "simulated ($mode) MSE $smse"
  echo "simulated ($mode): MSE $smse"
done
# Two cpp_client processes as the peers of a serverless gossip federation (D-PSGD) over mutual
# TLS: peer-1 joins through peer-0.
for k in 0 1; do
  "$starling" --log-level warn certs issue --ca "$work/ca" --name "peer-$k" --role peer \
    --san DNS:localhost,IP:127.0.0.1 --out "$work/p$k"
done
p0=$((port + 1))
p1=$((port + 2))
for k in 0 1; do
  seeds="[]"
  [[ $k == 1 ]] && seeds="[\"127.0.0.1:$p0\"]"
  lp=$p0
  [[ $k == 1 ]] && lp=$p1
  cat >"$work/peer-$k.toml" <<TOML
[tls]
ca = "$work/p$k/ca.crt"
cert = "$work/p$k/peer-$k.crt"
key = "$work/p$k/peer-$k.key"
[peer]
listen_host = "127.0.0.1"
listen_port = $lp
seeds = $seeds
seed_server_name = "localhost"
partition_index = $k
min_peers = 2
heartbeat_ms = 200
linger_ms = 500
[topology]
kind = "COMPLETE"
[algorithm]
kind = "DPSGD"
codec = "identity"
[rounds]
num_rounds = 5
seed = 1
[local]
local_steps = 20
batch_size = 16
learning_rate = 0.1
[task]
kind = "CONSENSUS"
[data]
num_clients = 2
TOML
done
peer_pids=()
for k in 0 1; do
  "$client" peer "$work/peer-$k.toml" "$k" >"$work/peer-$k.log" 2>&1 &
  pids+=($!)
  peer_pids+=($!)
  sleep 0.3
done
for p in "${peer_pids[@]}"; do wait "$p" || fail "a cpp_client peer exited with an error"; done
for k in 0 1; do
  line=$(grep "cpp_client: peer" "$work/peer-$k.log") || fail "peer-$k printed no result"
  echo "$line" | grep -q "peer 5 rounds" || fail "peer-$k: $line"
  pmse=$(echo "$line" | sed -n 's/.*mse \([0-9.]*\).*/\1/p')
  awk -v m="$pmse" 'BEGIN { exit !(m < 0.05) }' || fail "peer-$k's MSE $pmse"
  echo "gossip peer-$k over mutual TLS: 5 rounds, MSE $pmse"
done
echo "examples/cpp_client: built against the installed prefix, federated, gossiped and simulated"
