#!/usr/bin/env bash
# The image models on a GPU beside PyTorch eager on the same shapes (bench/gpu_check.sh runs it):
# training step throughput of the DDPM U-Net at configs/ddpm_mnist_cpu.toml's shape and at a
# 32x32 RGB shape (bench/configs/ddpm_rgb32.toml), and of the MNIST CNN; ours through the ops'
# CUDA forms (cuDNN convolutions in fp32 FMA math, and with STARLING_CUDA_TF32=1 on tensor
# cores), PyTorch with TF32 off (the same arithmetic) and on (its default for cuDNN convolutions). Then sampling 100 images in 100 steps:
# ours through `starling sample --device cuda` on a checkpoint trained here for a few steps,
# PyTorch's on its own random weights (the work does not depend on the weights).
# Usage: bench/image_gpu.sh BUILD_DIR [STEPS]
set -uo pipefail
build=${1:?usage: bench/image_gpu.sh BUILD_DIR [STEPS]}
steps=${2:-20}
py=${TORCH_PYTHON:-python3}
cd "$(dirname "$0")/.."
rows=()
row() {  # row LABEL JSON
  local j=$2
  rows+=("$(python3 - "$1" "$j" <<'PY'
import json, sys
label, raw = sys.argv[1], sys.argv[2]
try:
    j = json.loads(raw.strip().splitlines()[-1])
except Exception:
    print(f"| {label} | failed | | | |")
    sys.exit()
tf = " (TF32)" if j.get("tf32") else ""
print(f"| {label} | {j['engine']}{tf} | {j['batch']} | {j['ms_per_step']:.2f} | "
      f"{j['samples_per_s']:.0f} | {j.get('peak_device_mb', 0):.0f} |")
PY
)")
}
for spec in "ddpm configs/ddpm_mnist_cpu.toml MNIST-28" "ddpm bench/configs/ddpm_rgb32.toml RGB-32" \
            "cnn configs/fed_mnist_cnn_iid.toml CNN"; do
  set -- $spec
  model=$1 cfg=$2 label=$3
  for tf in 0 1; do  # ours in fp32 FMA math, then with TF32 convolutions and linears
    ours=$(STARLING_CUDA_TF32=$tf "$build/bench/image_throughput" --model "$model" --config "$cfg" \
           --device cuda --steps "$steps" 2>&1)
    echo "$ours"
    row "$label" "$ours"
  done
  for tf in "" "--tf32"; do
    theirs=$("$py" bench/torch_image.py --model "$model" --config "$cfg" --device cuda \
             --steps "$steps" $tf 2>&1)
    echo "$theirs"
    row "$label" "$theirs"
  done
done
echo
echo "| shape | engine | batch | ms/step | samples/s | peak GPU MB |"
echo "|---|---|---|---|---|---|"
printf '%s\n' "${rows[@]}"

# Sampling: 100 images, 100 ancestral steps, the MNIST shape.
# MNIST from STARLING_DATA_DIR or ../shared/data, else the repository's small fixture split.
data="${STARLING_DATA_DIR:-$PWD/../shared/data}"
ls "$data"/mnist/*train-images* >/dev/null 2>&1 || data="$PWD/tests/fixtures/data"
out="$build/ddpm_cuda"
echo
if "$build/apps/starling" train -c configs/ddpm_mnist_cpu.toml --device cuda \
     --set train.max_iters=40 --set train.eval_interval=20 --set train.log_interval=10 \
     --set ddpm.num_samples=4 --set "train.out_dir=$out" --set "data.data_dir=$data" 2>&1 | tail -3; then
  "$build/apps/starling" sample "$out/ckpt.safetensors" --device cuda --num 100 --steps 100 \
    --sampler ancestral --out "$out/samples100.png" 2>&1 | tail -1
fi
"$py" bench/torch_image.py --model ddpm --device cuda --steps 1 --warmup 0 --sample 100 \
  --sample-steps 100 2>&1 | tail -1 |
  python3 -c 'import json, sys; j = json.loads(sys.stdin.read()); print("pytorch eager: sampled %d images in %d steps in %.2f s" % (j["sample_images"], j["sample_steps"], j["sample_s"]))' ||
  echo "pytorch sampling failed"
