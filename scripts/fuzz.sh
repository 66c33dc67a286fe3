#!/usr/bin/env bash
# Fuzzes every parser of untrusted input with libFuzzer under ASan + UBSan: builds tests/fuzz with
# clang (-fsanitize=fuzzer,address,undefined) into build-fuzz, writes the seed corpora, and runs
# each target for a bounded time:
#   kiln_load_fuzzer             program files: loader, load_method, execute (seeds: programs the
#                                compiler wrote)
#   kiln_xnnpack_payload_fuzzer  the xnnpack delegate's payload decoder (init) and what it builds
#   kiln_mlx_payload_fuzzer      the mlx delegate's payload decoder on MLX's CPU device
#                                (both seeded with payloads the compiler lowered, tests/fuzz/delegate_case.h)
#   kiln_onnx_import_fuzzer      the ONNX importer, then compile + load (seeds: the ONNX backend test
#                                models of libonnx-testdata and the PP-OCR models of the venv's rapidocr)
#   kiln_npy_fuzzer              the .npy reader (seeds: NumPy-written files and Kiln's writer's)
# A target whose component is not built (no XNNPACK, MLX or ONNX importer) is left out, with a note.
# Exits non-zero when a fuzzer finds a crash, a sanitizer report, a leak, an input slower than
# 10 s or one using more than 2 GiB (the reproducer is left in build-fuzz/artifacts/<target>/;
# replay it with build-fuzz/tests/fuzz/<target> <file>). Every regression input in
# tests/fuzz/regressions/<target>/ is replayed at each start (add a fixed crash's reproducer there).
#
# Usage: scripts/fuzz.sh [seconds]   (default 60, or KILN_FUZZ_SECONDS)
#   `seconds` is the total fuzzing time, split evenly across the targets run (60 s and five
#   targets: 12 s each, the CI setting; with the clang ASan build the section takes about 5-6
#   minutes on 2 cores, ~2 min of it MLX's and the ONNX importer's sources). By hand, run as
#   long as you like: `scripts/fuzz.sh 3600` (an hour, 12 min per target), or one target:
#   `KILN_FUZZ_TARGETS=kiln_mlx_payload_fuzzer scripts/fuzz.sh 3600`.
# Environment:
#   KILN_FUZZ_TARGETS  space-separated targets to run (default: every one built)
#   KILN_FUZZ_RUNS     run each target for this many executions instead of by time (-runs=N), or
#                      per target: "kiln_npy_fuzzer=8000000,kiln_load_fuzzer=3000000" (others by time)
#   KILN_FUZZ_JOBS     targets run at a time (default 1; each then gets `seconds` * jobs / targets)
#   KILN_FUZZ_NICE     run the fuzzers under `nice -n <value>` (e.g. 19 on a shared machine)
#   KILN_JOBS          build parallelism (default 2)
# New inputs are kept in build-fuzz/corpus/<target>/ between runs (seeds are rewritten each time);
# each target's libFuzzer statistics (-print_final_stats=1) go to build-fuzz/logs/<target>.log.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
seconds=${1:-${KILN_FUZZ_SECONDS:-60}}
jobs=${KILN_JOBS:-2}
build=build-fuzz

# The project's virtualenv (as scripts/setup.sh names it), for MLX's CMake package, NumPy-written
# .npy seeds and the PP-OCR models; without it the mlx target and those seeds are left out.
req_hash=$(sha256sum requirements.txt | cut -c1-12)
venv=${KILN_VENV:-${XDG_DATA_HOME:-$HOME/.local/share}/kiln/venv-$req_hash}
python=""
[ -x "$venv/bin/python" ] && python=$venv/bin/python

echo "[fuzz] configure $build (clang, fuzzer + address;undefined)"
CC=clang CXX=clang++ cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG="-O1 -g1" \
  -DCMAKE_C_FLAGS_DEBUG="-O1 -g1" -DKILN_SANITIZE="address;undefined" -DKILN_BUILD_FUZZER=ON -DKILN_CPU_KERNELS=OFF \
  -DKILN_BUILD_TESTS=OFF -DKILN_BUILD_PYTHON=OFF -DKILN_BUILD_TOOLS=OFF -DKILN_BUILD_EXAMPLES=OFF \
  ${python:+-DPython_EXECUTABLE="$python"} >/dev/null
echo "[fuzz] build"
cmake --build "$build" -j"$jobs" --target kiln_fuzz

built=$(cat "$build/tests/fuzz/targets.txt")
targets=${KILN_FUZZ_TARGETS:-$built}
for t in kiln_load_fuzzer kiln_xnnpack_payload_fuzzer kiln_mlx_payload_fuzzer kiln_onnx_import_fuzzer kiln_npy_fuzzer; do
  grep -qx "$t" <<<"$built" || echo "[fuzz] note: $t not built (its component is not configured)"
done
for t in $targets; do
  grep -qx "$t" <<<"$built" || { echo "[fuzz] $t is not a built target (built: $(echo $built))" >&2; exit 2; }
done

echo "[fuzz] seeds"
seeds=$build/seeds
rm -rf "$seeds"
mkdir -p "$seeds/onnx"
"$build/tests/fuzz/kiln_fuzz_corpus" "$seeds"
# ONNX: every model of the ONNX backend test data (libonnx-testdata: node, simple, pytorch-* tests;
# about 1,070 small models) and the PP-OCR det/rec/cls models shipped in the venv's rapidocr.
onnx_max=0
if [ -d /usr/share/libonnx-testdata/data ]; then
  for f in /usr/share/libonnx-testdata/data/*/*/model.onnx; do
    d=${f%/model.onnx}
    cp "$f" "$seeds/onnx/$(basename "$(dirname "$d")")-$(basename "$d").onnx"
  done
else
  echo "[fuzz] note: /usr/share/libonnx-testdata not installed: no ONNX test-data seeds"
fi
if [ -n "$python" ]; then
  for f in "$venv"/lib/python3*/site-packages/rapidocr_onnxruntime/models/*.onnx; do
    [ -f "$f" ] && cp "$f" "$seeds/onnx/ppocr-$(basename "$f")"
  done
  # .npy files written by NumPy itself: every supported dtype, 0-d, empty, Fortran order,
  # big-endian, structured and object dtypes, format versions 1.0, 2.0 and 3.0.
  "$python" - "$seeds/npy" <<'PY'
import sys, numpy as np, io
from numpy.lib import format as fmt
d = sys.argv[1]
arrays = {
    "np-f4": np.arange(6, dtype="<f4").reshape(2, 3), "np-f2": np.array([1.5, -2, np.inf, np.nan], "<f2"),
    "np-f8-0d": np.array(3.25), "np-i8": np.arange(4, dtype="<i8"), "np-i4-empty": np.zeros((0, 3), "<i4"),
    "np-i1": np.array([-1, 2, -3], "i1"), "np-u1": np.arange(8, dtype="u1").reshape(2, 2, 2),
    "np-b1": np.array([True, False, True]), "np-fortran": np.asfortranarray(np.ones((2, 3), "<f4")),
    "np-big-endian": np.arange(3, dtype=">f4"), "np-structured": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")]),
    "np-u2": np.arange(3, dtype="<u2"), "np-c8": np.ones(2, "<c8"),
}
for name, a in arrays.items():
    np.save(f"{d}/{name}.npy", a)
np.save(f"{d}/np-object.npy", np.array([1, "x"], dtype=object), allow_pickle=True)
for version in ((2, 0), (3, 0)):
    with open(f"{d}/np-v{version[0]}.npy", "wb") as f:
        fmt.write_array(f, np.arange(5, dtype="<f4"), version=version)
PY
else
  echo "[fuzz] note: no virtualenv at $venv: no PP-OCR or NumPy-written seeds"
fi
for f in "$seeds/onnx"/*; do
  [ -f "$f" ] || continue
  s=$(stat -c %s "$f")
  [ "$s" -gt "$onnx_max" ] && onnx_max=$s
done

ntargets=$(wc -w <<<"$targets")
fuzz_jobs=${KILN_FUZZ_JOBS:-1}
per=$(( seconds * fuzz_jobs / ntargets ))
[ "$per" -lt 1 ] && per=1
# KILN_FUZZ_RUNS: one count for every target, or per target ("kiln_npy_fuzzer=8000000,...";
# targets not named run by time).
runs_of() {
  local r=${KILN_FUZZ_RUNS:-}
  case $r in
    *=*) tr ',' '\n' <<<"$r" | sed -n "s/^$1=//p" ;;
    *) echo "$r" ;;
  esac
}
echo "[fuzz] running $ntargets targets, $fuzz_jobs at a time, ${per} s each unless KILN_FUZZ_RUNS gives a count"
nice_cmd=()
[ -n "${KILN_FUZZ_NICE:-}" ] && nice_cmd=(nice -n "$KILN_FUZZ_NICE")

run_target() {  # <target>: runs it, leaves its log and exit status in $build/logs/<target>.{log,rc}
  local t=$1 short seed runs budget
  short=${t#kiln_}
  short=${short%_fuzzer}
  case $short in
    xnnpack_payload) seed=$seeds/xnnpack ;;
    mlx_payload) seed=$seeds/mlx ;;
    onnx_import) seed=$seeds/onnx ;;
    *) seed=$seeds/$short ;;
  esac
  runs=$(runs_of "$t")
  if [ -n "$runs" ]; then budget="-runs=$runs"; else budget="-max_total_time=$per"; fi
  local corpus=$build/corpus/$t artifacts=$build/artifacts/$t
  mkdir -p "$corpus" "$artifacts" "$build/logs"
  local dirs=("$corpus" "$seed")
  [ -d "tests/fuzz/regressions/$t" ] && dirs+=("tests/fuzz/regressions/$t")
  local extra=()
  case $t in
    kiln_load_fuzzer) extra+=(-dict=tests/fuzz/kiln.dict) ;;
    # The PP-OCR seeds are up to 11 MB: libFuzzer would truncate them to its 1 MB default. Their
    # runs take ~1 s against ~1 ms for the test-data models: scheduling scaled by execution time
    # keeps the fuzzer on the fast inputs most of the time.
    kiln_onnx_import_fuzzer)
      extra+=(-entropic_scale_per_exec_time=1)
      [ "$onnx_max" -gt 1048576 ] && extra+=(-max_len="$onnx_max") ;;
  esac
  echo "[fuzz] $t: $budget ($(ls "$seed" | wc -l) seeds, $(ls "$corpus" | wc -l) kept inputs)"
  local rc=0
  # One process per target. UBSan reports abort (halt_on_error). Memory: one allocation above
  # 512 MiB fails (max_allocation_size_mb): through malloc it returns null (XNNPACK then reports
  # xnn_status_out_of_memory, an error value), through operator new it is reported as a crash
  # (Kiln must check sizes from a file before allocating); MLX, which cannot survive a failed
  # allocation, is bounded by its fuzzer's mlx.max_array_bytes instead.
  ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=512${ASAN_OPTIONS:+:$ASAN_OPTIONS} \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "${nice_cmd[@]}" "$build/tests/fuzz/$t" "$budget" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$artifacts/" -print_final_stats=1 "${extra[@]}" "${dirs[@]}" \
    > "$build/logs/$t.log" 2>&1 || rc=$?
  echo "$rc" > "$build/logs/$t.rc"
}

running=0
for t in $targets; do
  rm -f "$build/logs/$t.rc"
  run_target "$t" &
  running=$((running + 1))
  if [ "$running" -ge "$fuzz_jobs" ]; then
    wait -n || true
    running=$((running - 1))
  fi
done
wait

status=0
failed=()
for t in $targets; do
  rc=$(cat "$build/logs/$t.rc" 2>/dev/null || echo 1)
  echo "[fuzz] $t:"
  grep -E '^stat::(number_of_executed_units|average_exec_per_sec|new_units_added|peak_rss_mb)|^#[0-9]+.*DONE' \
    "$build/logs/$t.log" | sed "s/^/[fuzz]   /" || true
  if [ "$rc" -ne 0 ]; then
    tail -n 60 "$build/logs/$t.log" >&2
    echo "[fuzz] FAIL: $t exited with $rc; reproducers in $build/artifacts/$t: $(ls "$build/artifacts/$t" | tr '\n' ' ')" >&2
    failed+=("$t")
    status=$rc
  fi
done
if [ "$status" -ne 0 ]; then
  echo "[fuzz] FAIL: ${failed[*]}" >&2
  exit "$status"
fi
echo "[fuzz] PASS: no crash, hang, leak or sanitizer report in $ntargets targets"
