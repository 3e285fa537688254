# Cross-compiling starling for ARM64 (aarch64) Linux from an x86-64 Debian 12 machine, with
# Debian's cross compiler (crossbuild-essential-arm64) and the arm64 multiarch -dev packages
# that scripts/deps.sh --arm64 installs. Tests run under qemu-user (CMAKE_CROSSCOMPILING_EMULATOR).
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Multiarch: arm64 libraries live in /usr/lib/aarch64-linux-gnu, headers are shared in
# /usr/include; programs (protoc) are the build machine's.
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu /usr)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE BOTH)
set(CMAKE_FIND_ROOT_PATH_MODE_PACKAGE BOTH)
set(ENV{PKG_CONFIG_LIBDIR} "/usr/lib/aarch64-linux-gnu/pkgconfig:/usr/share/pkgconfig")
set(ENV{PKG_CONFIG_PATH} "")

find_program(STARLING_QEMU_AARCH64 qemu-aarch64)
if(STARLING_QEMU_AARCH64)
  # The arm64 loader and libraries are installed by multiarch, so no sysroot (-L) is needed.
  set(CMAKE_CROSSCOMPILING_EMULATOR ${STARLING_QEMU_AARCH64})
endif()
