# CMake toolchain file: cross-compile Kiln for 64-bit Arm Linux (aarch64) on a Debian x86-64 host
# with Debian's cross toolchain and multiarch libraries (scripts/cross-test.sh installs them):
#   g++-aarch64-linux-gnu      compiler, binutils, and the target's libc/libstdc++ in /usr/aarch64-linux-gnu
#   libhwy-dev:arm64           Highway: headers in /usr/include (identical for every architecture),
#   libgtest-dev:arm64         libraries in /usr/lib/aarch64-linux-gnu (dpkg --add-architecture arm64)
#   qemu-user                  qemu-aarch64: runs the test binaries (gtest discovery, ctest)
#   libc6:arm64                the loader and libc the test binaries run with under QEMU
# Header-only dependencies (FlatBuffers, CLI11) are read from the host's /usr/include; flatc is a
# build-time host tool (the x86 /usr/bin/flatc), not a target program.
#
# Use: cmake -S . -B build-aarch64 -DCMAKE_TOOLCHAIN_FILE=cmake/toolchain-aarch64-linux-gnu.cmake \
#        -DKILN_BUILD_PYTHON=OFF -DKILN_WITH_XNNPACK=OFF -DKILN_WITH_MLX=OFF -DKILN_WITH_ONNX=OFF ...
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)

set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)

# Debian multiarch: find_library/find_package look in /usr/lib/aarch64-linux-gnu (and its cmake/
# directory) instead of the host's /usr/lib/x86_64-linux-gnu.
set(CMAKE_LIBRARY_ARCHITECTURE aarch64-linux-gnu)
# Programs (flatc, qemu) come from the host; nothing else is re-rooted (multiarch needs no sysroot).
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)

# Target programs run under user-mode QEMU: gtest_discover_tests lists the tests at build time and
# ctest runs them through this. The target's dynamic loader and libc are the arm64 multiarch ones
# (libc6:arm64, /lib/ld-linux-aarch64.so.1), NOT the cross toolchain's copy in /usr/aarch64-linux-gnu:
# with `-L /usr/aarch64-linux-gnu` (libc6-arm64-cross 2.36-8cross1) under Debian 12's qemu-aarch64
# 7.2 every std::thread creation hangs (a two-line program with one thread never returns), and
# Kiln's thread pool creates threads at the first program load. LD_LIBRARY_PATH (guest environment
# only, -E): the arm64 multiarch libraries (libhwy, libstdc++).
set(CMAKE_CROSSCOMPILING_EMULATOR
    qemu-aarch64 -E LD_LIBRARY_PATH=/usr/lib/aarch64-linux-gnu:/lib/aarch64-linux-gnu)
