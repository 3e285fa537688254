#!/usr/bin/env bash
# Runs EVERY shipped config (configs/*.toml and packaging/client.example.toml) for a round or
# two, or a few steps, through the real `starling` CLI, so that a memory error on any shipped
# path fails CI under the ASan + UBSan build. Data comes from tests/fixtures/data (small cuts
# of the real datasets, scripts/make_fixture_data.py); nothing is downloaded.
#   bash scripts/config_smoke.sh [BUILD_DIR]      (default build/asan; e.g. build/dev)
#   SMOKE_ONLY='fed_mnist_dp gpt_char_cpu' bash scripts/config_smoke.sh build/dev   (a subset)
#   SMOKE_KEEP=1 ... keeps the work folder; SMOKE_TIMEOUT_S (default 600): each config's limit
# Each config keeps its own model, codec, strategy and special features (DP, Multi-Krum, CHOCO,
# crash schedule, emulation, sweep, edge-client limits...); only clients, rounds, steps, batch
# and evaluation sizes are shrunk. Everything is written under one `mktemp -d` folder, removed
# at exit, and every process started is stopped on every exit path. Prints one line per config
# (config, kind, seconds, ok/FAIL); a failure prints the last 40 lines of its log; exit 1 if any
# failed. A config this script does not know is a failure, so a new config cannot slip through
# untested: add it to run_config below.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)
source scripts/lib/procs.sh

build="${1:-build/asan}"
bin="$repo/$build/apps/starling"
[[ -x "$bin" ]] || { echo "config_smoke: no binary at $bin (build the ${build#build/} preset)" >&2; exit 2; }
per_config_timeout="${SMOKE_TIMEOUT_S:-600}"

work=$(mktemp -d "${TMPDIR:-/tmp}/starling_smoke.XXXXXX")
# SMOKE_KEEP=1 keeps the folder (logs, configs, outputs) for a look after the run.
# shellcheck disable=SC2016  # the cleanup command is eval'ed at exit, $work expanded then
if [[ "${SMOKE_KEEP:-0}" == 1 ]]; then
  on_exit_kill_children 'echo "config_smoke: outputs kept in $work"'
else
  on_exit_kill_children 'rm -rf "$work"'
fi

export STARLING_DATA_DIR="$repo/tests/fixtures/data"
export STARLING_NO_DOWNLOAD=1  # the fixtures or nothing: never fetch into the repository
export OMP_NUM_THREADS=1
# Every ASan, LeakSanitizer and UBSan finding aborts the process, so the config fails. Where
# LeakSanitizer cannot run (under ptrace, e.g. strace or gdb, or a container that refuses it:
# "LeakSanitizer has encountered a fatal error"), run with ASAN_OPTIONS=detect_leaks=0.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

# toml_set SRC DST section.key=VALUE...: DST is SRC with each key set to the TOML VALUE (given
# as TOML: strings quoted). A key in its section is replaced in place; a missing key is added at
# the end of its section, a missing section at the end of the file. Single-line values only.
toml_set() {
  local src="$1" dst="$2"
  shift 2
  printf '%s\n' "$@" | awk -v src="$src" '
    function flush(sec,   i) {
      for (i = 1; i <= n; ++i)
        if (!done[i] && S[i] == sec) { print K[i] " = " V[i]; done[i] = 1 }
    }
    NR == FNR {
      eq = index($0, "="); if (eq == 0) next
      full = substr($0, 1, eq - 1); v = substr($0, eq + 1)
      dot = 0; for (j = length(full); j > 0; --j) if (substr(full, j, 1) == ".") { dot = j; break }
      ++n; S[n] = substr(full, 1, dot - 1); K[n] = substr(full, dot + 1); V[n] = v
      seen[S[n]] = 0
      next
    }
    {
      line = $0
      if (match(line, /^[ \t]*\[[^\]]+\][ \t]*(#.*)?$/)) {
        flush(cur)
        h = line; sub(/^[ \t]*\[/, "", h); sub(/\].*$/, "", h); gsub(/[ \t]/, "", h)
        cur = h; if (cur in seen) seen[cur] = 1
        print line; next
      }
      if (match(line, /^[ \t]*[A-Za-z0-9_-]+[ \t]*=/)) {
        k = substr(line, RSTART, RLENGTH); sub(/=$/, "", k); gsub(/[ \t]/, "", k)
        for (i = 1; i <= n; ++i)
          if (!done[i] && S[i] == cur && K[i] == k) { print K[i] " = " V[i]; done[i] = 1; next }
      }
      print line
    }
    END {
      flush(cur)
      for (i = 1; i <= n; ++i) if (!done[i]) {
        if (!(S[i] in printed)) { print ""; print "[" S[i] "]"; printed[S[i]] = 1 }
        # Later keys of the same missing section follow right below.
        print K[i] " = " V[i]; done[i] = 1
        for (j = i + 1; j <= n; ++j) if (!done[j] && S[j] == S[i]) { print K[j] " = " V[j]; done[j] = 1 }
      }
    }' - "$src" >"$dst"
}

# A TCP port on 127.0.0.1 that nothing listens on now.
free_port() {
  local p
  for _ in $(seq 50); do
    p=$((20000 + RANDOM % 12000))  # below the ephemeral ports (32768 and up)
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      echo "$p"
      return 0
    fi
  done
  echo "config_smoke: no free port found" >&2
  return 1
}

# Seconds left of this config's time limit (at least 1).
left_s() {
  local left=$((deadline - SECONDS))
  ((left > 0)) || left=1
  echo "$left"
}

# Runs one starling command, logged, within what is left of the config's time limit.
st() {
  echo "+ starling $*" >>"$log"
  timeout "$(left_s)" "$bin" "$@" >>"$log" 2>&1
}

# Waits (up to $2 s) for regex $3 in file $1; prints the matching line.
wait_for_line() {
  local file="$1" secs="$2" re="$3" line
  for _ in $(seq $((secs * 10))); do
    line=$(grep -m1 -E "$re" "$file" 2>/dev/null || true)
    [[ -n "$line" ]] && { echo "$line"; return 0; }
    sleep 0.1
  done
  return 1
}

is_task_arch() { grep -qE '^[[:space:]]*arch[[:space:]]*=[[:space:]]*"(GPT|MDLM|DDPM)"' "$1"; }

# --- kinds ------------------------------------------------------------------------------------

# starling train for a few steps, then sample (and eval) the checkpoint.
run_train() {
  local cfg="$1"
  shift
  local sets=(--set train.max_iters=2 --set train.eval_interval=1 --set train.eval_iters=1
    --set train.log_interval=1 --set train.warmup_iters=1 --set train.lr_decay_iters=2
    --set data.val_fraction=0.004 --set "train.out_dir=$out")
  for s in "$@"; do sets+=(--set "$s"); done
  st train --config "$cfg" "${sets[@]}"
  [[ -f "$out/ckpt.safetensors" ]] || { echo "no checkpoint in $out" >>"$log"; return 1; }
  case "$(grep -E '^[[:space:]]*arch[[:space:]]*=' "$cfg" | head -1)" in
    *ddpm*)
      local extra=()
      grep -qE '^[[:space:]]*dataset[[:space:]]*=[[:space:]]*"mnist"' "$cfg" && extra=(--classify)
      st sample --config "$cfg" --set "train.out_dir=$out" --num 4 --steps 3 \
        --out "$out/smoke.png" "${extra[@]}"
      ;;
    *mdlm*)
      st sample --config "$cfg" --set "train.out_dir=$out" --steps 4
      st eval --config "$cfg" --set "train.out_dir=$out"
      ;;
    *)
      st sample --config "$cfg" --set "train.out_dir=$out" -n 24
      st sample --config "$cfg" --set "train.out_dir=$out" -n 8 --no-kv-cache
      st eval --config "$cfg" --set "train.out_dir=$out"
      ;;
  esac
}

# starling aggregator --simulate for 2 rounds on a copy of the config with the overrides given.
run_aggregator() {
  local cfg="$1"
  shift
  local copy="$out/config.toml"
  mkdir -p "$out"
  toml_set "$cfg" "$copy" "server.state_dir=\"$out/state\"" "server.metrics_path=\"\"" \
    "eval.every_rounds=1" "$@"
  local args=(aggregator --config "$copy" --simulate --num-rounds 2)
  # A config with a status page keeps it, on a free port.
  if grep -qE '^[[:space:]]*metrics_port[[:space:]]*=[[:space:]]*[1-9]' "$cfg"; then
    args+=(--metrics-port "$(free_port)")
  fi
  st "${args[@]}"
  grep -q '"round":2' "$out/state/metrics.jsonl" || { echo "no round 2 in metrics" >>"$log"; return 1; }
  if is_task_arch "$cfg"; then
    st sample "$out/state/model.safetensors" --steps 3 --num 2 --out "$out/smoke.png" -n 24
  fi
}

# starling simulate for 2 rounds.
run_simulate() {
  local cfg="$1"
  shift
  local sets=(--set rounds.num_rounds=2 --set eval.every_rounds=1)
  for s in "$@"; do sets+=(--set "$s"); done
  st simulate -c "$cfg" -q -o "$out" "${sets[@]}"
  if [[ -f "$out/model.safetensors" ]] && is_task_arch "$cfg"; then
    st sample "$out/model.safetensors" -n 24
  fi
}

# starling peer --simulate: every peer in one process. $2: rounds; further args: overrides.
run_peer_sim() {
  local cfg="$1" rounds="$2"
  shift 2
  local use="$cfg"
  if (($#)); then
    mkdir -p "$out"
    use="$out/config.toml"
    toml_set "$cfg" "$use" "$@"
  fi
  st peer --config "$use" --simulate --num-rounds "$rounds" --metrics "$out/sim.jsonl"
  grep -q "\"round\":$rounds" "$out/sim.jsonl" || { echo "no round $rounds in sim.jsonl" >>"$log"; return 1; }
}

# configs/gossip_peer.toml as the real thing too: [peer].min_peers separate `starling peer`
# processes over mutual TLS (certificates from `starling certs`), the first on a free port
# (port_file), the others joining through it, 2 rounds; every one must end with status 0.
run_gossip_processes() {
  local cfg="$1" pki="$out/pki" n
  n=$(sed -nE 's/^[[:space:]]*min_peers[[:space:]]*=[[:space:]]*([0-9]+).*/\1/p' "$cfg" | head -1)
  n="${n:-4}"
  st certs init-ca --out "$pki/ca" --name starling-smoke-gossip
  local k
  for ((k = 0; k < n; ++k)); do
    st certs issue --ca "$pki/ca" --name "peer-$k" --role peer --san DNS:localhost,IP:127.0.0.1 \
      --out "$pki/peer-$k"
  done
  local pids=() seed="" rc=0
  for ((k = 0; k < n; ++k)); do
    local sets=("tls.ca=\"$pki/ca/ca.crt\"" "tls.cert=\"$pki/peer-$k/peer-$k.crt\""
      "tls.key=\"$pki/peer-$k/peer-$k.key\"" "peer.listen_port=0" "peer.partition_index=$k"
      "peer.metrics_path=\"$out/peer-$k.jsonl\"" "peer.state_dir=\"$out/peer-$k-state\"")
    if ((k == 0)); then
      sets+=("peer.port_file=\"$out/peer-0.port\"")
    else
      sets+=("peer.seeds=[\"$seed\"]")
    fi
    toml_set "$cfg" "$out/peer-$k.toml" "${sets[@]}"
    echo "+ starling peer --config $out/peer-$k.toml --num-rounds 2 (background)" >>"$log"
    timeout "$(left_s)" "$bin" peer --config "$out/peer-$k.toml" --num-rounds 2 \
      >"$out/peer-$k.log" 2>&1 &
    pids+=($!)
    if ((k == 0)); then
      for _ in $(seq 600); do [[ -s "$out/peer-0.port" ]] && break; sleep 0.1; done
      [[ -s "$out/peer-0.port" ]] || { echo "peer-0 wrote no port file" >>"$log"; rc=1; break; }
      seed="127.0.0.1:$(tr -d '[:space:]' <"$out/peer-0.port")"
    fi
  done
  for ((k = 0; k < ${#pids[@]}; ++k)); do
    local prc=0
    wait "${pids[$k]}" || prc=$?
    echo "--- peer-$k (exit $prc)" >>"$log"
    cat "$out/peer-$k.log" >>"$log"
    ((prc == 0)) || rc=$prc
  done
  return "$rc"
}

# packaging/client.example.toml: the edge client against a real aggregator on loopback, both
# separate processes over mutual TLS with certificates from `starling certs`. The aggregator
# runs the client's own file plus [server]/[rounds]; the client keeps its memory limit, upload
# cap, training condition (the command is `true`: on_ac_power is not on CI machines) and state
# file. `client --check` must pass every check, then the client trains 2 rounds.
run_edge_client() {
  local cfg="$1" pki="$out/pki"
  mkdir -p "$out"
  st certs init-ca --out "$pki/ca" --name starling-smoke
  st certs issue --ca "$pki/ca" --name aggregator --role server --san DNS:localhost,IP:127.0.0.1 \
    --out "$pki/aggregator"
  st certs issue --ca "$pki/ca" --name client-0 --role client --out "$pki/client-0"
  local data="\"$STARLING_DATA_DIR\""
  toml_set "$cfg" "$out/aggregator.toml" "tls.ca=\"$pki/ca/ca.crt\"" \
    "tls.cert=\"$pki/aggregator/aggregator.crt\"" "tls.key=\"$pki/aggregator/aggregator.key\"" \
    "data.data_dir=$data" "server.host=\"127.0.0.1\"" "server.port=0" \
    "server.state_dir=\"$out/agg_state\"" "rounds.num_rounds=2" "rounds.clients_per_round=1" \
    "rounds.fraction=0.0" "rounds.min_available=1" "rounds.min_updates=1" \
    "rounds.round_deadline_ms=120000" "eval.every_rounds=1" "eval.max_examples=200"
  echo "+ starling aggregator --config $out/aggregator.toml (background)" >>"$log"
  timeout "$(left_s)" "$bin" aggregator --config "$out/aggregator.toml" >"$out/aggregator.log" 2>&1 &
  local agg=$!
  local line port
  if ! line=$(wait_for_line "$out/aggregator.log" 120 'listening on [^ ]+:[0-9]+'); then
    cat "$out/aggregator.log" >>"$log"
    echo "aggregator did not start" >>"$log"
    return 1
  fi
  port=$(sed -E 's/.*listening on [^ ]+:([0-9]+).*/\1/' <<<"$line")
  toml_set "$cfg" "$out/client.toml" "tls.ca=\"$pki/client-0/ca.crt\"" \
    "tls.cert=\"$pki/client-0/client-0.crt\"" "tls.key=\"$pki/client-0/client-0.key\"" \
    "data.data_dir=$data" "client.server_host=\"127.0.0.1\"" "client.server_port=$port" \
    "client.server_name=\"localhost\"" "client.state_path=\"$out/client.state.safetensors\"" \
    "client.condition_command=\"true\""
  local rc=0
  st client --config "$out/client.toml" --check --check-timeout 60 || rc=$?
  if ((rc == 0)); then
    st client --config "$out/client.toml" || rc=$?
  fi
  if ((rc == 0)); then
    # The aggregator ends by itself after round 2.
    for _ in $(seq 1200); do kill -0 "$agg" 2>/dev/null || break; sleep 0.1; done
    if kill -0 "$agg" 2>/dev/null; then
      echo "aggregator still running 120 s after the client finished" >>"$log"
      rc=1
    fi
  fi
  if ((rc != 0)); then kill "$agg" 2>/dev/null || true; fi
  local agg_rc=0
  wait "$agg" || agg_rc=$?
  ((rc != 0 || agg_rc == 0)) || { echo "aggregator exited with $agg_rc" >>"$log"; rc=$agg_rc; }
  echo "--- aggregator log" >>"$log"
  cat "$out/aggregator.log" >>"$log"
  ((rc == 0)) || return "$rc"
  [[ -f "$out/client.state.safetensors" ]] || { echo "no client state file" >>"$log"; return 1; }
  grep -q '"round":2' "$out/agg_state/metrics.jsonl" || { echo "no round 2 in metrics" >>"$log"; return 1; }
}

# configs/fed_mnist_tier_root.toml and fed_mnist_tier_leaf.toml together: the root, one leaf and
# two clients of that leaf, each its own process over mutual TLS with certificates from
# `starling certs` (the leaf's of role leaf); two rounds, the root's model moved by the leaf's
# partial means, the leaf ending when the root does.
run_tier() {
  local root_cfg=configs/fed_mnist_tier_root.toml leaf_cfg=configs/fed_mnist_tier_leaf.toml
  local pki="$out/pki" data="\"$STARLING_DATA_DIR\""
  mkdir -p "$out"
  st certs init-ca --out "$pki/ca" --name starling-smoke-tiers
  st certs issue --ca "$pki/ca" --name aggregator --role server --san DNS:localhost,IP:127.0.0.1 \
    --out "$pki/aggregator"
  st certs issue --ca "$pki/ca" --name leaf-0 --role leaf --san DNS:localhost,IP:127.0.0.1 \
    --out "$pki/leaf-0"
  for k in 0 1; do st certs issue --ca "$pki/ca" --name "client-$k" --role client --out "$pki/client-$k"; done
  toml_set "$root_cfg" "$out/root.toml" "tls.ca=\"$pki/ca/ca.crt\"" \
    "tls.cert=\"$pki/aggregator/aggregator.crt\"" "tls.key=\"$pki/aggregator/aggregator.key\"" \
    "data.data_dir=$data" "server.port=0" "server.state_dir=\"$out/root_state\"" \
    "rounds.num_rounds=2" "rounds.clients_per_round=1" "rounds.min_available=1" \
    "rounds.min_updates=1" "local.local_steps=5" "eval.every_rounds=1" "eval.max_examples=200"
  echo "+ starling aggregator --config $out/root.toml (background)" >>"$log"
  timeout "$(left_s)" "$bin" aggregator --config "$out/root.toml" >"$out/root.log" 2>&1 &
  local root=$! line root_port leaf_port
  if ! line=$(wait_for_line "$out/root.log" 120 'listening on [^ ]+:[0-9]+'); then
    cat "$out/root.log" >>"$log"; kill "$root" 2>/dev/null || true; wait "$root" || true
    echo "root did not start" >>"$log"; return 1
  fi
  root_port=$(sed -E 's/.*listening on [^ ]+:([0-9]+).*/\1/' <<<"$line")
  toml_set "$leaf_cfg" "$out/leaf.toml" "tls.ca=\"$pki/leaf-0/ca.crt\"" \
    "tls.cert=\"$pki/leaf-0/leaf-0.crt\"" "tls.key=\"$pki/leaf-0/leaf-0.key\"" \
    "data.data_dir=$data" "server.port=0" "server.state_dir=\"$out/leaf_state\"" \
    "upstream.port=$root_port" "rounds.clients_per_round=2" "rounds.min_available=2" \
    "rounds.min_updates=2"
  echo "+ starling aggregator --config $out/leaf.toml (background)" >>"$log"
  timeout "$(left_s)" "$bin" aggregator --config "$out/leaf.toml" >"$out/leaf.log" 2>&1 &
  local leaf=$! rc=0
  if ! line=$(wait_for_line "$out/leaf.log" 120 'listening on [^ ]+:[0-9]+'); then
    echo "leaf did not start" >>"$log"; rc=1
  fi
  local clients=()
  if ((rc == 0)); then
    leaf_port=$(sed -E 's/.*listening on [^ ]+:([0-9]+).*/\1/' <<<"$line")
    for k in 0 1; do
      toml_set "$leaf_cfg" "$out/client-$k.toml" "tls.ca=\"$pki/client-$k/ca.crt\"" \
        "tls.cert=\"$pki/client-$k/client-$k.crt\"" "tls.key=\"$pki/client-$k/client-$k.key\"" \
        "data.data_dir=$data" "client.server_port=$leaf_port" "client.partition_index=$k" \
        "client.state_path=\"none\""
      echo "+ starling client --config $out/client-$k.toml (background)" >>"$log"
      timeout "$(left_s)" "$bin" client --config "$out/client-$k.toml" >"$out/client-$k.log" 2>&1 &
      clients+=($!)
    done
  fi
  local name pid prc
  for pid in "${clients[@]}" "$leaf" "$root"; do
    if ((rc != 0)); then kill "$pid" 2>/dev/null || true; fi
    prc=0; wait "$pid" || prc=$?
    ((prc == 0)) || rc=$prc
  done
  for name in root leaf client-0 client-1; do
    [[ -f "$out/$name.log" ]] && { echo "--- $name log" >>"$log"; cat "$out/$name.log" >>"$log"; }
  done
  ((rc == 0)) || return "$rc"
  grep -q '"round":2' "$out/root_state/metrics.jsonl" || { echo "no round 2 at the root" >>"$log"; return 1; }
  grep -q 'the mean goes up' "$out/leaf.log" || { echo "the leaf sent nothing up" >>"$log"; return 1; }
}

# --- the table: every shipped config and how it runs -------------------------------------------

# Sets $kind and runs config $1; unknown configs fail.
run_config() {
  local cfg="$1" name
  name=$(basename "$cfg" .toml)
  case "$cfg" in
    packaging/client.example.toml)
      kind=client
      run_edge_client "$cfg"
      return
      ;;
    packaging/*)
      kind=unknown
      echo "config_smoke.sh does not know how to run $cfg: add it to run_config" >>"$log"
      return 1
      ;;
  esac
  case "$name" in
    gpt_char_shakespeare) kind=train; run_train "$cfg" train.batch_size=4 ;;
    gpt_char_cpu | gpt_char_rope_cpu) kind=train; run_train "$cfg" ;;
    gpt2_lora_shakespeare)
      # The base swapped for the transformers-written fixture (32 positions).
      kind=train
      run_train "$cfg" "model.init_from=\"hf:$repo/tests/fixtures/hf_gpt2_tiny\"" model.block_size=32 ;;
    gpt2_base_wikitext)
      # WikiText-2 is not among the fixtures: the same model on Tiny Shakespeare.
      kind=train; run_train "$cfg" 'data.dataset="tinyshakespeare"' ;;
    mdlm_char_cpu | mdlm_char_rope_cpu | mdlm_char_bd3_cpu | mdlm_char_fused_cpu)
      kind=train; run_train "$cfg" ;;
    ddpm_mnist_cpu | ddpm_fashion_mnist_cpu)
      kind=train; run_train "$cfg" ddpm.num_samples=4 ddpm.sampling_steps=3 ;;

    fed_mnist_2nn_iid | fed_mnist_2nn_shards | fed_mnist_cnn_iid | fed_mnist_dp | fed_mnist_krum | \
      fed_mnist_quick | fed_mnist_dir05_dense | fed_mnist_dir05_topk)
      kind=aggregator; run_aggregator "$cfg" ;;
    fed_ddpm_mnist_dir8)
      kind=aggregator
      run_aggregator "$cfg" local.local_steps=2 local.batch_size=8 eval.max_examples=16 ;;
    fed_mdlm_roles8)
      kind=aggregator; run_aggregator "$cfg" local.local_steps=2 eval.max_examples=24 ;;
    fed_gpt2_lora_roles)
      # The base swapped for the tiny GPT-2 that transformers wrote (tests/fixtures/hf_gpt2_tiny,
      # with its own BPE): simulate, then the aggregator; its merged model goes out through
      # `export hf` and back in through `import hf`.
      kind=simulate
      local base="\"hf:$repo/tests/fixtures/hf_gpt2_tiny\""
      local small=("model.init_from=$base" model.block_size=32 local.local_steps=2
        eval.max_examples=32 simulate.central_baseline=false)
      run_simulate "$cfg" "${small[@]}" || return
      run_aggregator "$cfg" "${small[@]}" || return
      st export hf "$out/state/model.safetensors" --out "$out/hf"
      st import hf "$out/hf" --out "$out/reimported.safetensors"
      st sample "$out/reimported.safetensors" -n 8 ;;
    fed_gpt2_lora_wiki)
      # WikiText-2's first 8 test articles (the fixture cut), the tiny transformers-written
      # GPT-2 as the base (its BPE tokenizes the articles).
      kind=simulate
      run_simulate "$cfg" "model.init_from=\"hf:$repo/tests/fixtures/hf_gpt2_tiny\"" \
        model.block_size=32 local.local_steps=2 eval.max_examples=32 rounds.clients_per_round=4 \
        rounds.num_rounds=2 eval.every_rounds=1 simulate.central_baseline=false ;;

    sim_default | sim_shakespeare_codecs)
      kind=simulate; run_simulate "$cfg" local.local_steps=2 eval.max_examples=64 ;;
    sim_mnist_10k)
      # 10,000 clients need 10,000 training images; the fixture holds 3,000.
      kind=simulate; run_simulate "$cfg" data.num_clients=1000 ;;
    sim_mnist_100) kind=simulate; run_simulate "$cfg" ;;
    fed_mnist_tier_root | fed_mnist_tier_leaf)
      # A root, a leaf and its clients: each file runs in its role (run_tier).
      kind=aggregator; run_tier ;;
    fed_mnist_secagg)
      # Clients drop after sharing their keys, so the unmasking of dropped clients runs too;
      # then the real aggregator and clients over loopback TLS.
      kind=simulate
      run_simulate "$cfg" simulate.dropout=0.2 || return
      run_simulate "$cfg" simulate.mode=LOOPBACK ;;
    fed_mnist_secagg_dp)
      kind=simulate
      run_simulate "$cfg" simulate.dropout=0.1 || return
      run_simulate "$cfg" simulate.mode=LOOPBACK ;;
    sim_mnist_emulated)
      # Late joiners arrive after round 1 instead of 20, so the two rounds see them join.
      kind=simulate; run_simulate "$cfg" simulate.late_join_rounds=1 ;;

    gossip_mnist_crash16)
      # Peer 5 crashes after round 1 and rejoins after round 2, of 3.
      kind=peer; run_peer_sim "$cfg" 3 simulate.crash_round=1 simulate.rejoin_round=2 ;;
    gossip_consensus_ring16 | gossip_mnist_choco16 | gossip_mnist_exp16 | gossip_mnist_exp16_1step | \
      gossip_mnist_fedavg16 | gossip_mnist_fedavg16_1step)
      kind=peer; run_peer_sim "$cfg" 2 ;;
    gossip_peer)
      kind=peer; run_peer_sim "$cfg" 2; run_gossip_processes "$cfg" ;;
    gossip_gpt2_lora_roles8)
      # The base swapped for the transformers-written fixture (32 positions, its own BPE).
      kind=peer
      run_peer_sim "$cfg" 2 "model.init_from=\"hf:$repo/tests/fixtures/hf_gpt2_tiny\"" \
        model.block_size=32 local.local_steps=2 eval.max_examples=16 ;;

    *)
      kind=unknown
      echo "config_smoke.sh does not know how to run $cfg: add it to run_config" >>"$log"
      return 1
      ;;
  esac
}

configs=(configs/*.toml packaging/client.example.toml)
if [[ -n "${SMOKE_ONLY:-}" ]]; then
  picked=()
  for c in "${configs[@]}"; do
    for want in $SMOKE_ONLY; do [[ "$(basename "$c" .toml)" == "$want" ]] && picked+=("$c"); done
  done
  configs=("${picked[@]}")
fi

echo "config smoke: ${#configs[@]} configs with $bin (data $STARLING_DATA_DIR)"
failed=()
t_all=$SECONDS
for cfg in "${configs[@]}"; do
  name=$(basename "$cfg" .toml)
  out="$work/$name"
  log="$work/$name.log"
  : >"$log"
  kind=unknown
  t0=$SECONDS
  deadline=$((SECONDS + per_config_timeout))
  rc=0
  # A subshell, so that a failing command ends this config only (errexit inside it; not in a
  # `||` list, where bash would ignore it).
  set +e
  (
    set -e
    run_config "$cfg"
  )
  rc=$?
  set -e
  # The kind is recomputed outside the subshell for the table.
  kind=$(grep -m1 -oE '^\+ starling [a-z]+' "$log" | awk '{print $3}' || true)
  [[ "$cfg" == packaging/client.example.toml ]] && kind=client
  if ((rc == 0)) && grep -qE 'ERROR: (Address|Leak)Sanitizer|runtime error:' "$log" "$out"/*.log 2>/dev/null; then
    rc=99
  fi
  secs=$((SECONDS - t0))
  if ((rc == 0)); then
    printf '%-34s %-11s %5ds  ok\n' "$cfg" "${kind:-unknown}" "$secs"
  else
    why="rc $rc"
    ((rc == 124 || rc == 137)) && why="timed out after ${per_config_timeout} s"
    ((rc == 99)) && why="sanitizer report in the log"
    printf '%-34s %-11s %5ds  FAIL (%s)\n' "$cfg" "${kind:-unknown}" "$secs" "$why"
    echo "----- last 40 lines of $name.log"
    tail -n 40 "$log"
    echo "-----"
    failed+=("$cfg")
  fi
  [[ "${SMOKE_KEEP:-0}" == 1 ]] || rm -rf "$out"
done
echo "config smoke: $((${#configs[@]} - ${#failed[@]})) of ${#configs[@]} ok in $((SECONDS - t_all)) s"
if ((${#failed[@]})); then
  echo "failed: ${failed[*]}"
  exit 1
fi
