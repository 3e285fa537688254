#!/usr/bin/env bash
# The GPU machine's check, run from anywhere in the repository: configures the cuda preset,
# builds the CUDA tests and benchmarks, runs `ctest -L cuda` (kernels, codecs, the fused GPT
# trainer's CUDA backend), the CPU communicator tests, cuda_bench, cuda_codec_bench and
# gpt_train_bench (fused GPT vs PyTorch), `starling train --device cuda` for the GPT and the MDLM
# (the MDLM beside PyTorch's MDLM step), and appends date, commit, GPU and results to
# bench/RESULTS.md (also copied to $OUT when set, with the logs). Needs carry/ from
# bench/make_carry.sh where the machine lacks standalone Asio, toml++ or Catch2 v2. Env:
# CUDA_ARCH (default 90), JOBS (default nproc), BUILD_DIR (default build/cuda), TORCH_PYTHON
# (default python3), GPT_BENCH_SHAPES (default char), GPT_BENCH_WARMUP / GPT_BENCH_STEPS
# (default 2 / 5), GPU_CHECK_BUDGET (seconds from the start for the whole check, default 0: none),
# GPU_CHECK_ONLY (space-separated step names to run, default all; configure and build always run),
# GPT_BENCH_NO_TORCH (set: gpt_train_bench without the PyTorch rows).
#
# Steps run most important first (build, parity, the federated round, throughput, the user's
# path, micro-benchmarks, CPU-only tests last), each under its own time limit. With a budget, a
# step's limit is cut to the time left and a step that would start past it is skipped and
# reported as such, so the script always gets to write RESULTS.md before a lease ends. With $OUT
# set, RESULTS.md and one archive of the logs are copied there after every step.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
build="${BUILD_DIR:-$root/build/cuda}"
logs="$build/gpu_check-logs"

args=(-DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DSTARLING_BUILD_BENCH=ON)
if [ -d carry ]; then
  args+=(-DCatch2_DIR="$root/carry/lib/cmake/Catch2"
         -Dtomlplusplus_DIR="$root/carry/lib/cmake/tomlplusplus"
         -DCMAKE_PREFIX_PATH="$root/carry")
  cxx_flags="-isystem $root/carry/include"
fi
if [ -d carry/lib/pkgconfig ]; then
  export PKG_CONFIG_PATH="$root/carry/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
fi
# No curl development files: carried headers and the machine's own runtime library.
if [ ! -f /usr/include/curl/curl.h ] && [ ! -f /usr/include/x86_64-linux-gnu/curl/curl.h ] &&
   [ -f carry/include/curl/curl.h ]; then
  libcurl=$(ls /usr/lib/x86_64-linux-gnu/libcurl.so.4 /usr/lib/x86_64-linux-gnu/libcurl*.so.4 \
            2>/dev/null | head -1)
  [ -n "$libcurl" ] && args+=(-DCURL_INCLUDE_DIR="$root/carry/include" -DCURL_LIBRARY="$libcurl")
fi
# No protoc or no protobuf headers: the carried protobuf 3.21 (bench/make_carry.sh).
if { ! command -v protoc >/dev/null || [ ! -f /usr/include/google/protobuf/message.h ]; } &&
   [ -x carry/protobuf/bin/protoc ]; then
  echo "gpu_check: protobuf from carry/protobuf"
  args+=(-DProtobuf_PROTOC_EXECUTABLE="$root/carry/protobuf/bin/protoc"
         -DProtobuf_INCLUDE_DIR="$root/carry/protobuf/include"
         -DProtobuf_LIBRARY="$root/carry/protobuf/lib/libprotobuf.so")
  export LD_LIBRARY_PATH="$root/carry/protobuf/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  cxx_flags="${cxx_flags:-} -isystem $root/carry/protobuf/include"
fi
[ -n "${cxx_flags:-}" ] && args+=("-DCMAKE_CXX_FLAGS=$cxx_flags")
# CMake 4 refuses policy versions below 3.5 in old package configs unless told otherwise.
export CMAKE_POLICY_VERSION_MINIMUM=3.5
# Development files the configure step needs beyond carry/ (cmake/StarlingDeps.cmake): say at
# once which are missing instead of failing inside CMake.
missing=()
for h in pcre2.h curl/curl.h zlib.h cblas.h spdlog/spdlog.h CLI/CLI.hpp nlohmann/json.hpp \
         google/protobuf/message.h openssl/ssl.h; do
  found=no
  for d in /usr/include /usr/include/x86_64-linux-gnu /usr/include/x86_64-linux-gnu/openblas-openmp \
           /usr/include/openblas "$root/carry/include" "$root/carry/protobuf/include"; do
    [ -f "$d/$h" ] && found=yes && break
  done
  [ $found = yes ] || missing+=("$h")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "gpu_check: missing development headers: ${missing[*]} (carry them, see bench/make_carry.sh)"
fi
command -v ninja >/dev/null || args+=(-G "Unix Makefiles")
if ! command -v nvcc >/dev/null; then
  for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
    if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
  done
fi
# NCCL from Python's nvidia-nccl wheel when the toolkit has none (the wheel has only .so.2).
cuda_home=$(dirname "$(dirname "$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)")")
if [ ! -f "$cuda_home/include/nccl.h" ] && [ ! -f /usr/include/nccl.h ]; then
  nccl=$(python3 -c "import nvidia.nccl as m; print(m.__path__[0])" 2>/dev/null || true)
  if [ -n "$nccl" ]; then
    args+=(-DNCCL_ROOT="$nccl")
    export LD_LIBRARY_PATH="$nccl/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
fi
# cuDNN (the convolutions of the DDPM and the CNN) likewise from Python's nvidia-cudnn wheel.
# Header and library must come from one place: the wheel unless the toolkit or the system has
# both.
have_cudnn=no
if [ -f "$cuda_home/include/cudnn.h" ] && ls "$cuda_home"/lib64/libcudnn.so* >/dev/null 2>&1; then
  have_cudnn=yes
fi
if { [ -f /usr/include/cudnn.h ] || [ -f /usr/include/x86_64-linux-gnu/cudnn.h ]; } &&
   ls /usr/lib/x86_64-linux-gnu/libcudnn.so* >/dev/null 2>&1; then
  have_cudnn=yes
fi
if [ "$have_cudnn" = no ]; then
  cudnn=$("${TORCH_PYTHON:-python3}" -c "import nvidia.cudnn as m; print(m.__path__[0])" 2>/dev/null ||
          python3 -c "import nvidia.cudnn as m; print(m.__path__[0])" 2>/dev/null || true)
  if [ -n "$cudnn" ]; then
    args+=(-DCUDNN_ROOT="$cudnn")
    export LD_LIBRARY_PATH="$cudnn/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  else
    echo "gpu_check: no cudnn.h in the toolkit and no nvidia-cudnn Python package: configure will fail"
  fi
fi

rm -rf "$logs"
mkdir -p "$logs"
export STARLING_REQUIRE_GPU=1  # [cuda] tests fail, not skip, when no GPU is visible
status=ok
t0=$SECONDS
budget=${GPU_CHECK_BUDGET:-0}
summary=()
save_out() {  # copies what we have to $OUT: at most 8 files come back, so the logs go as one
  [ -n "${OUT:-}" ] || return 0
  tar -C "$(dirname "$logs")" -czf "$OUT/gpu_check-logs.tar.gz" "$(basename "$logs")" 2>/dev/null
  [ -f "$logs/summary.txt" ] && cp "$logs/summary.txt" "$OUT/"
  return 0
}
step() {  # step NAME LIMIT_S CMD...: CMD under `timeout`, output in $logs/NAME.log
  local name=$1 limit=$2; shift 2
  if [ -n "${GPU_CHECK_ONLY:-}" ] && [ "$name" != configure ] && [ "$name" != build ] &&
     [[ " $GPU_CHECK_ONLY " != *" $name "* ]]; then
    return
  fi
  if [ "$budget" -gt 0 ]; then
    local left=$((budget - (SECONDS - t0)))
    if [ "$left" -lt 15 ]; then
      echo "== $name: skipped (budget of ${budget} s spent)"; summary+=("$name: skipped")
      printf '%s\n' "${summary[@]}" > "$logs/summary.txt"
      status=failed; return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  echo "== $name (limit ${limit} s, at $((SECONDS - t0)) s): $*"
  local t=$SECONDS
  if timeout -k 5 "$limit" "$@" >"$logs/$name.log" 2>&1; then
    echo "   ok in $((SECONDS - t)) s"; summary+=("$name: ok in $((SECONDS - t)) s")
  else
    local rc=$?
    echo "   FAILED rc=$rc in $((SECONDS - t)) s (see $logs/$name.log)"; tail -30 "$logs/$name.log"
    summary+=("$name: FAILED rc=$rc in $((SECONDS - t)) s"); status=failed
  fi
  printf '%s\n' "${summary[@]}" > "$logs/summary.txt"
  save_out
}

{ nvidia-smi; command -v nvcc && nvcc --version; cmake --version; command -v ninja; echo "args: ${args[*]}"; } \
  >"$logs/environment.log" 2>&1
step configure 120 cmake --preset cuda -B "$build" "${args[@]}"
step build 360 cmake --build "$build" -j "${JOBS:-$(nproc)}" \
  --target starling_cuda_tests starling_comm_tests cuda_bench cuda_codec_bench gpt_train_bench \
  image_throughput starling
# Parity first: every CUDA op against its CPU reference, the fused GPT and MDLM 10-step runs,
# codecs, the allocator, NCCL with one rank. Independent processes, so several at once.
step ctest_cuda 200 ctest --test-dir "$build" -L cuda --no-tests=error --output-on-failure \
  --timeout 150 -j "${CTEST_JOBS:-6}"

# The image models on the GPU (the ops' CUDA forms: cuDNN convolutions, group norms, ...): the
# DDPM U-Net at two shapes and the CNN, training steps beside PyTorch eager with TF32 off and on,
# then a short `starling train --device cuda` of configs/ddpm_mnist_cpu.toml and 100 images
# sampled in 100 steps beside PyTorch's (bench/image_gpu.sh).
step image_gpu 300 bash bench/image_gpu.sh "$build" 20

# A federated round on the GPU: an aggregator and two `starling client --device DEV` processes
# over mutual TLS (bench/fed_device_round.sh: tiny GPT, 2 rounds, local AdamW) with DEV cpu
# (autograd) and cuda (the fused engine on cuda:0); the global models must agree within 1e-4,
# and each client prints the share of its round time spent outside training.
step fed_round_cpu 120 bash bench/fed_device_round.sh "$build" cpu "$build/fed_round_cpu"
step fed_round_cuda 120 bash bench/fed_device_round.sh "$build" cuda "$build/fed_round_cuda"
step fed_round_parity 30 python3 bench/compare_safetensors.py --tol 1e-4 \
  "$build/fed_round_cpu/state/global_model.safetensors" \
  "$build/fed_round_cuda/state/global_model.safetensors"
# The same with a tiny MNIST DDPM (the U-Net through the ops' CUDA forms on each client's GPU).
TASK=ddpm step fed_round_ddpm_cpu 120 bash bench/fed_device_round.sh "$build" cpu \
  "$build/fed_round_ddpm_cpu"
TASK=ddpm step fed_round_ddpm_cuda 120 bash bench/fed_device_round.sh "$build" cuda \
  "$build/fed_round_ddpm_cuda"
step fed_round_ddpm_parity 30 python3 bench/compare_safetensors.py --tol 1e-4 \
  "$build/fed_round_ddpm_cpu/state/global_model.safetensors" \
  "$build/fed_round_ddpm_cuda/state/global_model.safetensors"

# Fused GPT training steps (bf16 linear layers; GPT_BENCH_PRECISION=fp32 for fp32) beside PyTorch
# eager and torch.compile (under bf16 autocast) (TORCH_PYTHON: a python with torch; without one
# the PyTorch rows say why). The char GPT with few steps by default (about a minute, most of it
# torch.compile); GPT_BENCH_SHAPES=char,gpt2 adds GPT-2 124M (a few more).
torch_args=(--python "${TORCH_PYTHON:-python3}")
[ -n "${GPT_BENCH_NO_TORCH:-}" ] && torch_args=(--no-torch)  # ours only (a short check)
step gpt_train_bench 420 "$build/bench/gpt_train_bench" "${torch_args[@]}" \
  --shapes "${GPT_BENCH_SHAPES:-char}" --precision "${GPT_BENCH_PRECISION:-bf16}" \
  --warmup "${GPT_BENCH_WARMUP:-2}" \
  --steps "${GPT_BENCH_STEPS:-5}"
# The same shapes, ours only, with the other attention paths (docs/cuda.md, "Flash attention"):
# cuBLAS with the (B, H, T, T) probabilities stored, and the tensor-core flash kernels.
for mode in materialized bf16; do
  STARLING_CUDA_ATTENTION=$mode step "gpt_train_bench_$mode" 120 \
    "$build/bench/gpt_train_bench" --no-torch --shapes "${GPT_BENCH_SHAPES:-char}" \
    --precision "${GPT_BENCH_PRECISION:-bf16}" --warmup "${GPT_BENCH_WARMUP:-2}" \
    --steps "${GPT_BENCH_STEPS:-5}"
done
# The same steps without CUDA graphs (the default captures a step's forward and backward once
# and replays it; the note column of every row says which ran).
STARLING_CUDA_GRAPHS=0 step gpt_train_bench_nographs 120 \
  "$build/bench/gpt_train_bench" --no-torch --shapes "${GPT_BENCH_SHAPES:-char}" \
  --precision "${GPT_BENCH_PRECISION:-bf16}" --warmup "${GPT_BENCH_WARMUP:-2}" \
  --steps "${GPT_BENCH_STEPS:-5}"

# Where a fused step goes, operation by operation (CUDA events around each; ours only): the char
# GPT and GPT-2 124M, 3 profiled steps after 2 timed ones.
step gpt_train_profile 120 "$build/bench/gpt_train_bench" --no-torch --shapes char,gpt2 \
  --precision "${GPT_BENCH_PRECISION:-bf16}" --warmup 2 --steps 2 --profile 3

# Per-op timings at GPT-2's training shapes (attention: materialized, flash fp32, flash bf16).
step cuda_bench 120 "$build/bench/cuda_bench"

# The user's path: `starling train --device cuda` on the baby GPT config, 200 steps, its
# checkpoint sampled back on the CPU. Tiny Shakespeare from STARLING_DATA_DIR or ../shared/data;
# without it, this repository's docs as the corpus (the step checks the path, not the loss).
data_args=()
shakespeare="${STARLING_DATA_DIR:-$root/../shared/data}/tinyshakespeare/input.txt"
if [ ! -f "$shakespeare" ]; then
  cat README.md docs/*.md > "$build/corpus.txt"
  data_args=(--set "data.path=$build/corpus.txt")
fi
step train_cuda 120 "$build/apps/starling" train -c configs/gpt_char_cpu.toml --device cuda \
  --set train.max_iters=200 --set train.eval_interval=100 --set "train.out_dir=$build/train_cuda" \
  "${data_args[@]}"
step sample_cuda_ckpt 60 "$build/apps/starling" sample "$build/train_cuda/ckpt.safetensors" -n 100
# Data parallel over every visible GPU (one rank per GPU over NCCL) where there are several: the
# char config with 24 rows per step (a multiple of 2, 3, 4, 6 and 8 GPUs), tokens/s beside
# train_cuda's (docs/cuda.md, "Data parallel on the fused engine").
ngpu=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${ngpu:-0}" -ge 2 ]; then
  step train_cuda_dp 180 "$build/apps/starling" train -c configs/gpt_char_cpu.toml \
    --gpus "$(seq -s, 0 $((ngpu - 1)))" --set train.batch_size=24 --set train.max_iters=200 \
    --set train.eval_interval=100 \
    --set "train.out_dir=$build/train_cuda_dp" "${data_args[@]}"
  # Two clients, each data parallel over two GPUs ([client] gpus; local.batch_size 8 splits):
  # the same global model as the CPU run within 1e-4.
  step fed_round_cuda_dp 120 bash bench/fed_device_round.sh "$build" cuda "$build/fed_round_cuda_dp" 0,1
  step fed_round_dp_parity 30 python3 bench/compare_safetensors.py --tol 1e-4 \
    "$build/fed_round_cpu/state/global_model.safetensors" \
    "$build/fed_round_cuda_dp/state/global_model.safetensors"
fi

# The MDLM on the GPU (issue 8): `starling train --device cuda` on the char shape of
# ../shared/bench/REFERENCE.md (V=65, T=256, L=6, H=6, C=384, B=64, bidirectional, bf16 linear
# layers), 100 steps; its training tokens/s beside PyTorch's MDLM step (bench/torch_gpt.py --mdlm,
# eager, bf16 autocast) on the same shape; the checkpoint evaluated and sampled back on the CPU.
mdlm_shape=(--set model.block_size=256 --set model.n_layer=6 --set model.n_head=6
  --set model.n_embd=384 --set train.batch_size=64)
step mdlm_train_cuda 120 "$build/apps/starling" train -c configs/mdlm_char_cpu.toml --device cuda \
  "${mdlm_shape[@]}" --set train.precision=bf16 --set train.max_iters=100 \
  --set train.warmup_iters=10 --set train.lr_decay_iters=100 --set train.eval_interval=1000 \
  --set train.eval_iters=2 --set train.log_interval=20 --set "train.out_dir=$build/mdlm_cuda" \
  "${data_args[@]}"
step mdlm_torch_cuda 120 "${TORCH_PYTHON:-python3}" bench/torch_gpt.py --mdlm --device cuda --bf16 \
  --vocab 65 --block 256 --layers 6 --heads 6 --embd 384 --batch 64 --warmup 5 --steps 50
step mdlm_sample_ckpt 60 "$build/apps/starling" sample "$build/mdlm_cuda/ckpt.safetensors" --steps 32

step cuda_codec_bench 120 "$build/bench/cuda_codec_bench"  # GPU codecs beside the CPU ones
# The GPU-trained MDLM checkpoint's whole-split bound on the GPU (`eval --device cuda`, the fused
# forward; on the CPU this took more than a minute).
step mdlm_eval_ckpt 60 "$build/apps/starling" eval "$build/mdlm_cuda/ckpt.safetensors" \
  --device cuda
# CPU-only (CI runs them too): last, so that GPU minutes go to the GPU first.
step comm_tests 120 "$build/tests/starling_comm_tests"

gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD 2>/dev/null || commit="$commit+uncommitted"
{
  echo
  echo "## $(date -u '+%Y-%m-%d %H:%M UTC') · commit $commit · ${gpu:-no GPU found} · $status"
  echo
  echo "ctest -L cuda: $(grep -E 'tests passed|tests failed' "$logs/ctest_cuda.log" 2>/dev/null | tail -1)"
  echo
  echo "CPU communicator: $(tail -2 "$logs/comm_tests.log" 2>/dev/null | tr -s '\n' ' ')"
  echo
  grep -E '^(GPU:|\|)' "$logs/cuda_bench.log" 2>/dev/null || echo "(cuda_bench did not run)"
  echo
  grep -E '^(GPU:|\|)' "$logs/cuda_codec_bench.log" 2>/dev/null || echo "(cuda_codec_bench did not run)"
  echo
  grep -E '^(GPU:|\||ratio:)' "$logs/gpt_train_bench.log" 2>/dev/null || echo "(gpt_train_bench did not run)"
  echo
  for mode in materialized bf16 nographs; do
    if [ "$mode" = nographs ]; then
      echo "The same without CUDA graphs (STARLING_CUDA_GRAPHS=0):"
    else
      echo "The same with STARLING_CUDA_ATTENTION=$mode:"
    fi
    grep -E '^\| [a-z]' "$logs/gpt_train_bench_$mode.log" 2>/dev/null | grep -v '^| shape' ||
      echo "(did not run)"
  done
  echo
  if grep -q '^Where a step of' "$logs/gpt_train_profile.log" 2>/dev/null; then
    sed -n '/^Where a step of/,$p' "$logs/gpt_train_profile.log"
  else
    echo "(gpt_train_bench --profile did not run)"
  fi
  echo
  echo "Image models on the GPU (bench/image_gpu.sh, fp32; ours: cuDNN FMA math):"
  grep -E '^\|' "$logs/image_gpu.log" 2>/dev/null || echo "(image_gpu did not run)"
  grep -E '^(trained|wrote|pytorch eager: sampled)' "$logs/image_gpu.log" 2>/dev/null
  echo
  echo "starling train --device cuda (configs/gpt_char_cpu.toml, 200 steps): $(grep -E '^trained' "$logs/train_cuda.log" 2>/dev/null || echo 'did not finish')"
  [ -f "$logs/train_cuda_dp.log" ] && echo && echo "The same over every GPU (--gpus 0,...): $(grep -E '^trained' "$logs/train_cuda_dp.log" || echo 'did not finish')"
  echo
  echo "Federated GPT round, 2 client processes on cuda:0 (bench/fed_device_round.sh): global model vs the CPU run: $(tail -1 "$logs/fed_round_parity.log" 2>/dev/null || echo 'did not run'); clients: $(grep -h -o 'rounds took .*' "$logs/fed_round_cuda.log" 2>/dev/null | tr '\n' ' ' || echo 'did not run')"
  echo
  echo "Federated DDPM round, 2 client processes on cuda:0: global model vs the CPU run: $(tail -1 "$logs/fed_round_ddpm_parity.log" 2>/dev/null || echo 'did not run'); clients: $(grep -h -o 'rounds took .*' "$logs/fed_round_ddpm_cuda.log" 2>/dev/null | tr '\n' ' ' || echo 'did not run')"
  [ -f "$logs/fed_round_dp_parity.log" ] && echo && echo "The same with each client data parallel over GPUs 0 and 1: $(tail -1 "$logs/fed_round_dp_parity.log")"
  echo
  echo "MDLM, char shape (T=256 L=6 H=6 C=384 B=64), bf16: starling train --device cuda: $(grep -E '^trained' "$logs/mdlm_train_cuda.log" 2>/dev/null || echo 'did not finish'); PyTorch: $(tail -1 "$logs/mdlm_torch_cuda.log" 2>/dev/null || echo 'did not run'); eval: $(grep -E '^val:' "$logs/mdlm_eval_ckpt.log" 2>/dev/null || echo 'did not run')"
} >> bench/RESULTS.md
{ echo; echo "steps:"; printf '  %s\n' "${summary[@]}"; } >> bench/RESULTS.md
save_out
if [ -n "${OUT:-}" ]; then cp bench/RESULTS.md "$OUT/"; fi
echo "gpu_check: $status after $((SECONDS - t0)) s"
printf '  %s\n' "${summary[@]}"
[ "$status" = ok ]
