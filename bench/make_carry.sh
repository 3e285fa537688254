#!/usr/bin/env bash
# Runs on a build machine that has them (Debian: libasio-dev, libtomlplusplus-dev, catch2 v2,
# prometheus-cpp-dev): copies the dependencies a GPU machine lacks into carry/ (git-ignored):
# header-only ones, and prometheus-cpp's headers and core library (it needs only libstdc++), for
# bench/gpu_check.sh there. toml++ is carried header-only (TOML_HEADER_ONLY=1) with its own
# small CMake config, since Debian's config points at a shared library.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
out="$root/carry"
rm -rf "$out"
mkdir -p "$out/include" "$out/lib/cmake/tomlplusplus"
cp -r /usr/include/asio /usr/include/asio.hpp /usr/include/toml++ /usr/include/catch2 "$out/include/"
cp -r /usr/lib/cmake/Catch2 "$out/lib/cmake/"  # relocatable: include dir is ../../../include
# The config checks that every imported file exists, though starling links only Catch2::Catch2.
cp /usr/lib/libCatch2WithMain.a "$out/lib/"
# prometheus-cpp core: found by cmake/StarlingDeps.cmake's fallback (prometheus/registry.h and
# libprometheus-cpp-core.so.1.0) through -DCMAKE_PREFIX_PATH=carry.
cp -r /usr/include/prometheus "$out/include/"
cp /usr/lib/x86_64-linux-gnu/libprometheus-cpp-core.so.1.0 "$out/lib/"
# PCRE2 (GPT-2 tokenizer): headers, the library (it needs only libc) under both names, and a
# relocatable pkg-config file (bench/gpu_check.sh puts carry/lib/pkgconfig on PKG_CONFIG_PATH).
mkdir -p "$out/lib/pkgconfig"
cp /usr/include/pcre2.h "$out/include/"
cp /usr/lib/x86_64-linux-gnu/libpcre2-8.so.0 "$out/lib/libpcre2-8.so.0"
cp /usr/lib/x86_64-linux-gnu/libpcre2-8.so.0 "$out/lib/libpcre2-8.so"
cat > "$out/lib/pkgconfig/libpcre2-8.pc" <<'PC'
prefix=${pcfiledir}/../..
libdir=${prefix}/lib
includedir=${prefix}/include
Name: libpcre2-8
Description: PCRE2 8-bit (carried by bench/make_carry.sh)
Version: 10.42
Libs: -L${libdir} -lpcre2-8
Cflags: -I${includedir}
PC
# curl's headers only: its library pulls distribution-specific sonames, so gpu_check.sh links
# the GPU machine's own libcurl.so.4 when that machine has no development files.
cp -r /usr/include/x86_64-linux-gnu/curl "$out/include/"
cat > "$out/lib/cmake/tomlplusplus/tomlplusplusConfig.cmake" <<'CFG'
# toml++ header-only, relative to this file (written by bench/make_carry.sh).
if(NOT TARGET tomlplusplus::tomlplusplus)
  get_filename_component(_toml_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
  add_library(tomlplusplus::tomlplusplus INTERFACE IMPORTED)
  set_target_properties(tomlplusplus::tomlplusplus PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${_toml_prefix}/include"
    INTERFACE_COMPILE_DEFINITIONS "TOML_HEADER_ONLY=1")
  unset(_toml_prefix)
endif()
CFG
cat > "$out/lib/cmake/tomlplusplus/tomlplusplusConfigVersion.cmake" <<'CFG'
set(PACKAGE_VERSION "3.3.0")
set(PACKAGE_VERSION_COMPATIBLE TRUE)
if(PACKAGE_FIND_VERSION STREQUAL PACKAGE_VERSION)
  set(PACKAGE_VERSION_EXACT TRUE)
endif()
CFG
# Protobuf 3.21 (protoc, libprotoc, libprotobuf, headers) under carry/protobuf, used by
# gpu_check.sh only where the GPU machine has no protoc or no protobuf headers: Debian's 3.21.12
# matches Ubuntu 24.04's, and the libraries need only libstdc++ and zlib. protoc is a wrapper that
# finds its libraries beside it.
pb="$out/protobuf"
mkdir -p "$pb/bin" "$pb/lib" "$pb/include/google"
cp -r /usr/include/google/protobuf "$pb/include/google/"
cp /usr/lib/x86_64-linux-gnu/libprotobuf.so.32 "$pb/lib/libprotobuf.so.32"
cp /usr/lib/x86_64-linux-gnu/libprotoc.so.32 "$pb/lib/libprotoc.so.32"
ln -sf libprotobuf.so.32 "$pb/lib/libprotobuf.so"
cp "$(command -v protoc)" "$pb/bin/protoc.bin"
cat > "$pb/bin/protoc" <<'SH'
#!/bin/sh
here=$(cd "$(dirname "$0")" && pwd)
LD_LIBRARY_PATH="$here/../lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/protoc.bin" "$@"
SH
chmod +x "$pb/bin/protoc"
du -sh "$out"
echo "carry/ ready; bench/gpu_check.sh passes these to CMake:"
echo "  -DCatch2_DIR=$out/lib/cmake/Catch2 -Dtomlplusplus_DIR=$out/lib/cmake/tomlplusplus"
echo "  -DCMAKE_CXX_FLAGS='-isystem $out/include'   (standalone Asio)"
