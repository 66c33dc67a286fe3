#!/usr/bin/env bash
# Builds and runs the C++ tests under sanitizers; exits non-zero on any failure.
#   build-asan: -DKILN_SANITIZE="address;undefined", the whole C++ test suite (tests/kiln_tests)
#   build-tsan: -DKILN_SANITIZE=thread, the concurrency tests (Concurrency.*: methods of one program
#               in parallel, thread pools, and two sessions of a program with state run from two
#               threads) in tests/kiln_concurrency_tests, which compiles only the two test files that
#               hold them (tests/cpp/method_api_test.cpp, symbolic_state_test.cpp)
# Usage: scripts/sanitizers.sh [asan|tsan|all]   (default all)
# Environment: KILN_JOBS (build parallelism, default 2), CC/CXX (compiler; default the system's),
#   KILN_TSAN_FILTER (gtest filter for the thread-sanitizer run, default 'Concurrency.*').
#   KILN_SANITIZE_CPU_TARGETS (the SIMD targets to compile the cpu kernels for: CMake's
#   KILN_CPU_TARGETS; "all" for every one). Default: the one target the tests run at on this machine,
#   as build/tools/kiln --version names it (the sanitized tests never switch targets, so the other
#   targets' kernels would be compiled, at sanitizer cost, and never run; ctest and scripts/test.sh
#   section targets run them unsanitized); all when there is no build/tools/kiln to ask.
# Builds use -O1 -g1 with assertions on (a sanitizer build wants line numbers, not speed).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
what=${1:-all}
jobs=${KILN_JOBS:-2}

cpu_targets=${KILN_SANITIZE_CPU_TARGETS:-}
if [ -z "$cpu_targets" ] && [ -x build/tools/kiln ]; then
  cpu_targets=$(build/tools/kiln --version | sed -n 's/^cpu kernels: \([a-z0-9_]*\) .*/\1/p')
fi
[ "$cpu_targets" = all ] && cpu_targets=""
echo "[sanitizers] cpu kernels compiled for: ${cpu_targets:-every target} (KILN_CPU_TARGETS)"

configure_and_build() {  # <build dir> <sanitizers> <target>
  local dir=$1 san=$2 target=$3
  echo "[sanitizers] configure $dir (KILN_SANITIZE=$san)"
  cmake -S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
    -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" -DKILN_SANITIZE="$san" -DKILN_BUILD_PYTHON=OFF -DKILN_BUILD_TOOLS=OFF \
    -DKILN_BUILD_TESTS=ON -DKILN_BUILD_FUZZER=OFF -DKILN_CPU_TARGETS="$cpu_targets" >/dev/null
  echo "[sanitizers] build $dir"
  cmake --build "$dir" -j"$jobs" --target "$target"
}

status=0
if [ "$what" = all ] || [ "$what" = asan ]; then
  start=$SECONDS
  configure_and_build build-asan "address;undefined" kiln_tests
  echo "[sanitizers] run build-asan/tests/kiln_tests (all tests)"
  if ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1:check_initialization_order=1 \
     UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
     ./build-asan/tests/kiln_tests --gtest_brief=1; then
    echo "[sanitizers] address;undefined: PASS ($((SECONDS - start)) s)"
  else
    echo "[sanitizers] address;undefined: FAIL" >&2
    status=1
  fi
fi
if [ "$what" = all ] || [ "$what" = tsan ]; then
  start=$SECONDS
  configure_and_build build-tsan thread kiln_concurrency_tests
  filter=${KILN_TSAN_FILTER:-Concurrency.*}
  # A filter that matches nothing would pass: the run must hold at least one test.
  count=$(./build-tsan/tests/kiln_concurrency_tests --gtest_filter="$filter" --gtest_list_tests | grep -c '^  ' || true)
  [ "$count" -gt 0 ] || { echo "[sanitizers] thread: no test matches --gtest_filter='$filter'" >&2; exit 1; }
  echo "[sanitizers] run build-tsan/tests/kiln_concurrency_tests --gtest_filter='$filter' ($count tests)"
  if TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
     ./build-tsan/tests/kiln_concurrency_tests --gtest_filter="$filter" --gtest_brief=1; then
    echo "[sanitizers] thread: PASS ($((SECONDS - start)) s)"
  else
    echo "[sanitizers] thread: FAIL" >&2
    status=1
  fi
fi
exit $status
