#!/usr/bin/env bash
# The direct convolution kernels on arm64 (tests/arm64/conv_kernels_check.cc): cross-compiled with
# Debian's aarch64 g++ (the portable vector kernels become NEON code) and run under qemu-user,
# after the same check natively on every instruction set this x86 machine has. Correctness only:
# timings under qemu mean nothing. A minute where scripts/arm64_check.sh (the whole arm64 build,
# its test suite under qemu, a federated round) takes most of an hour, so CI runs this one.
# Installs g++-aarch64-linux-gnu and qemu-user when missing (apt-get, as root).
# Usage: bash scripts/arm64_kernels_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
if ! command -v aarch64-linux-gnu-g++ >/dev/null || ! command -v qemu-aarch64 >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q g++-aarch64-linux-gnu qemu-user >/dev/null
fi
src=(tests/arm64/conv_kernels_check.cc core/ops/conv_kernels.cc core/ops/conv_kernels_generic.cc)
flags=(-std=c++20 -O2 -Wall -Wextra -Werror -fno-predictive-commoning -I.)
echo "== x86-64, every instruction set this CPU has"
g++ "${flags[@]}" -c core/ops/conv_kernels_avx2.cc -mavx2 -mfma -o "$out/avx2.o"
g++ "${flags[@]}" -c core/ops/conv_kernels_avx512.cc -mavx512f -mfma -o "$out/avx512.o"
g++ "${flags[@]}" "${src[@]}" "$out/avx2.o" "$out/avx512.o" -o "$out/check_x86"
"$out/check_x86"
echo "== arm64 (NEON) under qemu"
aarch64-linux-gnu-g++ "${flags[@]}" "${src[@]}" -o "$out/check_arm64"
qemu-aarch64 -L /usr/aarch64-linux-gnu "$out/check_arm64"
