#!/usr/bin/env bash
# Fuzzes the program loader: builds tests/fuzz with clang (-fsanitize=fuzzer,address,undefined)
# into build-fuzz, writes a seed corpus of valid programs with the real compiler, and runs
# libFuzzer for a bounded time. Exits non-zero when the fuzzer finds a crash, a sanitizer
# report, a leak, an input slower than 10 s or one using more than 2 GiB (the reproducer is
# left in build-fuzz/artifacts/; replay it with build-fuzz/tests/fuzz/kiln_load_fuzzer <file>).
# Usage: scripts/fuzz.sh [seconds]        (default 60, or KILN_FUZZ_SECONDS)
# Environment: KILN_JOBS (build parallelism, default 2).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${1:-${KILN_FUZZ_SECONDS:-60}}
jobs=${KILN_JOBS:-2}
build=build-fuzz

echo "[fuzz] configure $build (clang, fuzzer + address;undefined)"
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
  -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" -DKILN_SANITIZE="address;undefined" -DKILN_BUILD_FUZZER=ON \
  -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_PYTHON=OFF -DKILN_BUILD_TOOLS=OFF >/dev/null
echo "[fuzz] build"
cmake --build "$build" -j"$jobs" --target kiln_load_fuzzer kiln_fuzz_corpus

rm -rf "$build/seeds"
mkdir -p "$build/seeds" "$build/corpus" "$build/artifacts"
"$build/tests/fuzz/kiln_fuzz_corpus" "$build/seeds"

echo "[fuzz] running kiln_load_fuzzer for ${seconds} s"
# New inputs go to $build/corpus (kept between runs); seeds are read only.
status=0
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
"$build/tests/fuzz/kiln_load_fuzzer" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -dict=tests/fuzz/kiln.dict -artifact_prefix="$build/artifacts/" -print_final_stats=1 \
  "$build/corpus" "$build/seeds" || status=$?
if [ "$status" -ne 0 ]; then
  echo "[fuzz] FAIL: the fuzzer exited with $status; reproducers: $(ls "$build/artifacts" | tr '\n' ' ')" >&2
  exit "$status"
fi
echo "[fuzz] PASS: no crash in ${seconds} s"
