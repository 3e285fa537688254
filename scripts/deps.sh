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
  libpcre2-dev zlib1g-dev
  libcurl4-openssl-dev
  catch2
)
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
