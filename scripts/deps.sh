#!/usr/bin/env bash
# Installs the Debian packages starling builds with (idempotent: does nothing when all are
# present). Run as root on Debian 12, or with sudo available.
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git
  libopenblas-openmp-dev
  libspdlog-dev libfmt-dev libcli11-dev libtomlplusplus-dev nlohmann-json3-dev
  libprotobuf-dev protobuf-compiler
  libasio-dev libssl-dev openssl
  libpcre2-dev zlib1g-dev libpng-dev
  libcurl4-openssl-dev
  prometheus-cpp-dev
  libopenmpi-dev openmpi-bin
  catch2
  python3
)
# --arm64: also the cross toolchain, qemu-user and the arm64 multiarch -dev packages of every
# compiled library above (the arm64 preset, docs/edge.md).
ARM64=0
for arg in "$@"; do
  case "$arg" in
    --arm64) ARM64=1 ;;
    *) echo "deps.sh: unknown argument $arg" >&2; exit 2 ;;
  esac
done
if ((ARM64)); then
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then
    ${SUDO_CMD:-$([[ $(id -u) -ne 0 ]] && echo sudo)} dpkg --add-architecture arm64
    ${SUDO_CMD:-$([[ $(id -u) -ne 0 ]] && echo sudo)} apt-get update -qq
  fi
  PACKAGES+=(crossbuild-essential-arm64 qemu-user
    libopenblas-openmp-dev:arm64 libspdlog-dev:arm64 libfmt-dev:arm64 libtomlplusplus-dev:arm64
    libprotobuf-dev:arm64 libssl-dev:arm64 libpcre2-dev:arm64 zlib1g-dev:arm64 libpng-dev:arm64
    libcurl4-openssl-dev:arm64 libprometheus-cpp-core1.0:arm64)
fi
if [[ "${STARLING_DEPS_EXTRA:-}" != "" ]]; then
  read -r -a extra <<<"${STARLING_DEPS_EXTRA}"
  PACKAGES+=("${extra[@]}")
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if ((${#missing[@]} == 0)); then
  exit 0
fi

SUDO=""
if [[ $(id -u) -ne 0 ]]; then
  SUDO="sudo"
fi
echo "starling: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
