#!/usr/bin/env bash
# Cross-architecture test: builds Kiln's runtime, compiler and C++ tests for another CPU
# architecture on this x86-64 Debian 12 machine and runs them under user-mode QEMU.
#
#   scripts/cross-test.sh aarch64
#
# Steps (docs/cross-test.md):
#   1. packages   Debian's cross toolchain g++-aarch64-linux-gnu, qemu-user (qemu-aarch64), and the
#                 arm64 multiarch libraries the runtime and tests link and run with (dpkg
#                 --add-architecture arm64; libc6:arm64, libstdc++6:arm64, libhwy-dev:arm64,
#                 libgtest-dev:arm64). Skipped when all are installed.
#   2. reference  tests/cross/make_reference.py with the project's virtualenv and the x86 kiln
#                 module: whole programs (mobilenet_v3_small, a transformer block, quantized linears)
#                 compiled here, with PyTorch eager's outputs as .npy, into build-aarch64/reference/.
#   3. build      CMake with cmake/toolchain-aarch64-linux-gnu.cmake into build-aarch64/: runtime,
#                 compiler, kiln CLI, kiln_tests and kiln_npy_tests (no Python binding, xnnpack, mlx,
#                 ONNX importer or examples).
#   4. qemu       the whole C++ suite (kiln_tests, sharded over KILN_JOBS processes, and
#                 kiln_npy_tests) under qemu-aarch64 with KILN_CPU_TARGET=neon; every shard must
#                 print "kiln cpu target: neon" (tests/cpp/cpu_target_env.cpp) and the reference
#                 programs must all have been compared (tests/cpp/reference_programs_test.cpp).
#
# Environment: KILN_JOBS (parallel build jobs and test shards, default: number of CPUs),
#              KILN_CROSS_TIMEOUT (seconds one test process may run under qemu, default 900),
#              KILN_VENV (the project's virtualenv; default: the one scripts/setup.sh prints),
#              KILN_CROSS_TARGET (the cpu target to force under qemu, default neon: the only
#              one compiled for aarch64 today, docs/cpu-kernels.md),
#              KILN_CCACHE=1 (compile through ccache; off by default: CI measures a cold build).
# scripts/test.sh runs this as its section "cross" (KILN_SKIP=cross skips it locally).
set -euo pipefail

usage() { echo "usage: scripts/cross-test.sh aarch64" >&2; exit 2; }
[ $# -eq 1 ] || usage
case "$1" in
  aarch64) ;;
  *) echo "scripts/cross-test.sh: unsupported architecture '$1' (supported: aarch64)" >&2; usage ;;
esac

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
jobs=${KILN_JOBS:-$(nproc)}
build=build-aarch64
target=${KILN_CROSS_TARGET:-neon}
multiarch_libs=/usr/lib/aarch64-linux-gnu:/lib/aarch64-linux-gnu   # arm64 multiarch packages (libhwy, libstdc++)
# No `-L /usr/aarch64-linux-gnu`: with the cross toolchain's libc (libc6-arm64-cross) qemu-aarch64
# 7.2 hangs in every thread creation; the multiarch libc6:arm64 (/lib/ld-linux-aarch64.so.1) works.
# Same command as CMAKE_CROSSCOMPILING_EMULATOR in the toolchain file.
qemu=(qemu-aarch64 -E "LD_LIBRARY_PATH=$multiarch_libs")

timings=()
step_start=0
step() { step_name=$1; step_start=$(date +%s); printf '\n---- cross-test %s: %s ----\n' "$1" "${*:2}"; }
step_done() { timings+=("$(printf '%-10s %5ss' "$step_name" $(( $(date +%s) - step_start )))"); }

# ---- 1. packages ----
step packages "cross toolchain, qemu-user, arm64 multiarch libraries"
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
apt_get() { as_root env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 -q "$@"; }
# Host tools (flatc and the header-only FlatBuffers and CLI11 are read from the host: headers are
# the same on every architecture) and the target's libraries. libhwy-dev and libgtest-dev are
# Multi-Arch: same, so the arm64 ones install beside the amd64 ones (same version, same headers).
packages=(g++-aarch64-linux-gnu qemu-user cmake ninja-build flatbuffers-compiler libflatbuffers-dev libcli11-dev
          libc6:arm64 libstdc++6:arm64 libhwy-dev:arm64 libgtest-dev:arm64)
missing=()
for p in "${packages[@]}"; do
  [ "$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)" = installed ] || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing: ${missing[*]}"
  if ! dpkg --print-foreign-architectures | grep -qx arm64; then as_root dpkg --add-architecture arm64; fi
  apt_get update
  if ! apt-cache show libhwy-dev:arm64 > /dev/null 2>&1; then
    echo "scripts/cross-test.sh: the configured Debian mirror serves no arm64 packages (apt-cache show libhwy-dev:arm64" \
         "found nothing after apt-get update with the arm64 architecture added)" >&2
    exit 1
  fi
  apt_get install -y --no-install-recommends "${missing[@]}"
else
  echo "all installed: ${packages[*]}"
fi
echo "$(aarch64-linux-gnu-g++ --version | head -n 1); $(qemu-aarch64 --version | head -n 1)"
step_done

# ---- 2. reference programs (x86: kiln Python module + PyTorch eager) ----
step reference "tests/cross/make_reference.py -> $build/reference"
venv=${KILN_VENV:-$(bash scripts/setup.sh | tail -n 1)}
python=$venv/bin/python
[ -x "$python" ] || { echo "scripts/cross-test.sh: no Python at $python (KILN_VENV or scripts/setup.sh)" >&2; exit 1; }
if ! PYTHONPATH=python "$python" -c 'import kiln._kiln' 2> /dev/null; then
  # Standalone run without scripts/test.sh's build: build the x86 module (as test.sh configures it).
  echo "the x86 kiln module is not built: building target _kiln in build/"
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$python"
  cmake --build build -j "$jobs" --target _kiln
fi
rm -rf "$build/reference"
mkdir -p "$build"
PYTHONPATH=python "$python" tests/cross/make_reference.py "$build/reference"
step_done

# ---- 3. cross build ----
step build "cmake/toolchain-aarch64-linux-gnu.cmake -> $build (-j $jobs)"
launcher=()
if [ "${KILN_CCACHE:-0}" = 1 ] && command -v ccache > /dev/null; then
  launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B "$build" -G Ninja -DCMAKE_TOOLCHAIN_FILE="$root/cmake/toolchain-aarch64-linux-gnu.cmake" \
  -DCMAKE_BUILD_TYPE=Release -DKILN_BUILD_PYTHON=OFF -DKILN_BUILD_EXAMPLES=OFF -DKILN_BUILD_TOOLS=ON \
  -DKILN_WITH_XNNPACK=OFF -DKILN_WITH_MLX=OFF -DKILN_WITH_ONNX=OFF -DFLATC=/usr/bin/flatc "${launcher[@]}"
cmake --build "$build" -j "$jobs"
aarch64-linux-gnu-readelf -h "$build/tests/kiln_tests" | grep -q 'Machine: *AArch64' || { echo "scripts/cross-test.sh: $build/tests/kiln_tests is not an aarch64 binary" >&2; exit 1; }
build_s=$(( $(date +%s) - step_start ))
step_done

# ---- 4. the C++ suite under qemu-aarch64 at the forced target ----
step qemu "kiln_tests ($jobs shards) and kiln_npy_tests under qemu-aarch64, KILN_CPU_TARGET=$target"
export KILN_CPU_TARGET=$target
export KILN_REFERENCE_DIR=$root/$build/reference
# A hung test fails the section (exit 124) instead of eating CI's whole budget.
shard_timeout=${KILN_CROSS_TIMEOUT:-900}
logs=()
pids=()
for (( i = 0; i < jobs; i++ )); do
  log=$build/qemu-kiln_tests-shard$i.log
  logs+=("$log")
  GTEST_TOTAL_SHARDS=$jobs GTEST_SHARD_INDEX=$i timeout "$shard_timeout" "${qemu[@]}" "$build/tests/kiln_tests" --gtest_color=no > "$log" 2>&1 &
  pids+=($!)
done
npy_log=$build/qemu-kiln_npy_tests.log
logs+=("$npy_log")
timeout "$shard_timeout" "${qemu[@]}" "$build/tools/kiln_npy_tests" --gtest_color=no > "$npy_log" 2>&1 || npy_rc=$?
failed=0
for i in "${!pids[@]}"; do
  rc=0
  wait "${pids[$i]}" || rc=$?
  if [ $rc -ne 0 ]; then echo "kiln_tests shard $i exited with $rc: ${logs[$i]}" >&2; failed=1; fi
done
[ "${npy_rc:-0}" -eq 0 ] || { echo "kiln_npy_tests exited with $npy_rc: $npy_log" >&2; failed=1; }
passed=0; fails=0; skips=0
for log in "${logs[@]}"; do
  # The target that ran: printed once per binary by tests/cpp/cpu_target_env.cpp (kiln_tests) .
  if [ "$log" != "$npy_log" ]; then
    ran=$(sed -n 's/^kiln cpu target: \([a-z0-9_]*\).*/\1/p' "$log" | head -n 1)
    if [ "$ran" != "$target" ]; then
      echo "scripts/cross-test.sh: $log: the cpu target that ran is '${ran:-not printed}', not '$target'" >&2
      failed=1
    fi
  fi
  passed=$(( passed + $(sed -n 's/^\[  PASSED  \] \([0-9]*\) tests\{0,1\}\..*/\1/p' "$log" | head -n 1 | grep . || echo 0) ))
  fails=$(( fails + $(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$log" | head -n 1 | grep . || echo 0) ))
  skips=$(( skips + $(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\{0,1\}, listed below.*/\1/p' "$log" | head -n 1 | grep . || echo 0) ))
done
# Every reference program compared (the test skips without KILN_REFERENCE_DIR, so count them).
expected=$(grep -cv '^#' "$build/reference/manifest.txt")
compared=$(cat "${logs[@]}" | grep -c "^reference .* at target $target: .*: ok$" || true)
cat "${logs[@]}" | grep '^reference ' || true
if [ "$compared" -lt "$expected" ]; then
  echo "scripts/cross-test.sh: $compared reference program outputs compared ok, expected $expected" >&2
  failed=1
fi
# The cpu-kernel tests must run at the target, not skip: they are what compares the optimized
# kernels with the portable ones on this architecture.
kernel_skips=$(cat "${logs[@]}" | sed -n 's/^\[  SKIPPED \] \(\(Cpu\|VecMath\|SdpaKvCache\|IndexPutInPlace\)[A-Za-z0-9_]*\.[A-Za-z0-9_]*\).*/\1/p' | sort -u)
if [ -n "$kernel_skips" ]; then
  echo "scripts/cross-test.sh: cpu-kernel tests skipped at target $target (they must run):" $kernel_skips >&2
  failed=1
fi
if [ $failed -ne 0 ]; then
  for log in "${logs[@]}"; do
    echo "==== $log: failed tests (details in the log) ===="
    grep -E '^\[  FAILED  \] [A-Za-z]' "$log" | sort -u || true
    grep -m 5 -A 4 -E 'Failure$' "$log" || true
  done
fi
echo "skipped tests (their features are not built or not in this target):"
cat "${logs[@]}" | sed -n 's/^\[  SKIPPED \] \([A-Za-z].*\)/  \1/p' | sort -u | head -n 40
qemu_s=$(( $(date +%s) - step_start ))
step_done

printf '\n---- cross-test aarch64 summary ----\n'
printf '%s\n' "${timings[@]}"
echo "cross build + qemu run: $(( build_s + qemu_s ))s (CI budget: 900s)"
echo "aarch64 under qemu, cpu target $target: $passed passed, $fails failed, $skips skipped"
exit $failed
