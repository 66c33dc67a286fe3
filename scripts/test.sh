#!/usr/bin/env bash
# THE test command for Kiln. On a fresh Debian 12 machine it does everything:
#   1. set-up      scripts/setup.sh: apt packages and the pinned Python virtualenv
#   2. build       CMake (Ninja, Release) into build/, with the venv's Python for the binding
#   3. ctest       the C++ tests (GoogleTest)
#   4. pytest      tests/python with PYTHONPATH=python (numerics against PyTorch eager, CLI, ...),
#                  one pytest-xdist worker per job
#   4b. targets    the cpu-kernel Python tests (and the quantized decode test) again at one more SIMD target:
#                  avx2 on an AVX-512 machine, scalar on an AVX2-only one
#   5. install     cmake --install build --prefix build/install, then builds examples/app (linked
#                  with each combination of the backend components: kiln::runtime alone gets
#                  NotFound naming the backend) and examples/mv3 (classify) out of tree against it
#                  (find_package(kiln)), checks the app's output and classifies photos with
#                  mv3_portable.kiln vs PyTorch eager
#   5b. package    pip wheel . (scikit-build-core; the compiler cache of step 2 makes it a relink),
#                  installs the wheel into a fresh virtualenv and runs tests/package/smoke.py from a
#                  folder outside the checkout (import kiln, the kiln command, export + run)
#   6. sanitizers  scripts/sanitizers.sh, when present
#   7. fuzz        scripts/fuzz.sh, when present
#   8. cross       scripts/cross-test.sh aarch64: runtime, compiler and C++ tests cross-compiled for
#                  aarch64 and run under qemu-aarch64 at the NEON target, with whole programs
#                  compared against PyTorch eager outputs made here (docs/cross-test.md)
# Exits non-zero on the first failure, naming the section. CI runs it through .ci/run.
#
# Environment: KILN_JOBS (parallel build jobs, default: number of CPUs),
#              KILN_SKIP ("sanitizers", "fuzz", "cross" or several, space-separated: skip those
#              sections; for local iteration only: CI sets nothing and runs every section).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

jobs=${KILN_JOBS:-$(nproc)}
skip=" ${KILN_SKIP:-} "
current=""
start_all=$(date +%s)
summary=()

section() {
  current=$1
  section_start=$(date +%s)
  printf '\n==================== %s: %s ====================\n' "$1" "${*:2}"
}
section_done() {
  summary+=("$(printf '%-12s %4ss  ok' "$current" $(( $(date +%s) - section_start )))")
}
skipped() {
  case "$skip" in *" $1 "*) summary+=("$(printf '%-12s    -   skipped (KILN_SKIP)' "$1")"); return 0 ;; esac
  return 1
}
trap 'rc=$?; if [ $rc -ne 0 ]; then printf "\n*** scripts/test.sh: FAILED in section \"%s\" (exit %d)\n" "$current" $rc >&2; fi' EXIT

section setup "scripts/setup.sh (system packages, Python virtualenv)"
# The CPU and its SIMD features, so that a failure can be placed (kernels and eager references
# take different paths on AVX2, AVX-512 and Arm machines).
cpu_model=$(grep -m1 -E '^(model name|Model name|Hardware|CPU part)' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//' || true)
cpu_simd=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo | cut -d: -f2- | tr ' ' '\n' |
  grep -E '^(sse4_2|avx|avx2|fma|f16c|avx512[a-z0-9_]*|avx_vnni|amx[a-z0-9_]*|asimd[a-z]*|sve[0-9a-z]*|fphp|i8mm|bf16)$' |
  tr '\n' ' ' || true)
echo "cpu: ${cpu_model:-unknown} ($(nproc) cores); SIMD: ${cpu_simd:-none found}"
venv=$(bash scripts/setup.sh | tail -n 1)
[ -x "$venv/bin/python" ] || { echo "scripts/setup.sh did not print a virtualenv path (got '$venv')" >&2; exit 1; }
export KILN_VENV=$venv   # sub-scripts that call setup.sh get the same virtualenv
python=$venv/bin/python
echo "virtualenv: $venv"
echo "CI=${CI:-false}  jobs=$jobs  $(cmake --version | head -n 1)  $(c++ --version | head -n 1)"
"$python" -c 'import sys, numpy, torch; print(f"python {sys.version.split()[0]}, numpy {numpy.__version__}, torch {torch.__version__}")'
section_done

section build "configure and build (Release) into build/"
# ccache (when installed: scripts/setup.sh does) lets the wheel build of section `package` reuse
# these objects: the same sources, flags and compiler, in a build folder at the same depth.
launcher=()
if command -v ccache >/dev/null; then
  export CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$python" "${launcher[@]}"
cmake --build build -j "$jobs"
# Every optional part is built in CI (scripts/setup.sh installs what each needs): a part that
# quietly failed to configure would turn its tests into skips and leave the run green.
if [ "${CI:-false}" = true ]; then
  PYTHONPATH=python "$python" - <<'PY'
import os, sys
import kiln
missing = [f"the {b} backend" for b in ("xnnpack", "mlx") if b not in kiln._kiln.backend_names()]
if not hasattr(kiln._kiln, "import_onnx"):
    missing.append("the ONNX importer (libonnx-dev, libprotobuf-dev)")
for exe in ("examples/ocr/ocr", "examples/diffusion/generate", "examples/mv3/classify", "tools/kiln"):
    if not os.access(os.path.join("build", exe), os.X_OK):
        missing.append(f"build/{exe}")
if missing:
    sys.exit("CI build is missing optional parts whose tests would be skipped: " + "; ".join(missing))
print("optional parts built: xnnpack, mlx, ONNX importer, ocr, generate, classify")
PY
fi
section_done

section ctest "C++ tests (ctest)"
ctest --test-dir build --output-on-failure -j "$jobs"
section_done

section pytest "Python tests (pytest tests/python)"
# pytest-xdist: one worker process per job, each test file whole on one worker (--dist loadfile
# keeps a file's module fixtures, such as test_opinfo's, from running once per worker).
# tests/python/conftest.py gives each worker its own temporary folder (MLX's kernel cache).
PYTHONPATH=python "$python" -m pytest -q -n "$jobs" --dist loadfile tests/python
section_done

section targets "cpu-kernel Python tests at the other SIMD targets this CPU has"
# pytest above ran the cpu kernels at the best target this machine has (AVX-512 on Zen 4); the
# numerics of the cpu-kernel test files run again at the next one that matters on other machines:
# avx2 (an AVX2-only CPU) on an AVX-512 machine, else scalar (any other CPU). One target, not both,
# to keep CI within its time: the other CI machine kind covers the other (an AVX2-only machine runs
# pytest at avx2 and this section at scalar), and ctest already reran the C++ cpu-kernel tests at
# every target (cpu_kernels_at_*). A target this CPU lacks is skipped, and said so.
# shellcheck disable=SC2207  # one word per target
available=($(PYTHONPATH=python "$python" -c 'import kiln; print(" ".join(kiln.available_cpu_targets()))'))
best=${available[0]}
echo "cpu targets available: ${available[*]} (pytest ran at $best)"
ran_one=false
for t in avx2 scalar; do
  if [ "$t" = "$best" ] || [ "$ran_one" = true ]; then continue; fi
  case " ${available[*]} " in
    *" $t "*)
      echo "--- cpu-kernel tests at KILN_CPU_TARGET=$t"
      KILN_CPU_TARGET=$t PYTHONPATH=python "$python" -m pytest -q -p no:cacheprovider -n "$jobs" --dist loadfile \
        tests/python/test_cpu_*.py tests/python/test_winograd.py \
        "tests/python/test_quant.py::test_quantized_linear_decode_odd_sizes"
      ran_one=true ;;
    *) echo "--- $t: not available on this CPU, skipped" ;;
  esac
done
# Highway 1.0.3 compiles its avx3_dl target with the VEX-encoded AVX-VNNI enabled, which AVX-512 CPUs
# without AVX-VNNI (AMD Zen 4, Intel Ice Lake) lack, and GCC may vectorize a plain integer loop in that
# code into {vex} vpdpbusd (SIGILL there; src/kernels/cpu/quantized.cpp). None may be in the runtime.
if command -v objdump >/dev/null; then
  vex=$(objdump -d build/libkiln_runtime.a | grep -c '{vex} vpdp' || true)
  echo "VEX-encoded AVX-VNNI instructions in libkiln_runtime.a: $vex"
  [ "$vex" = 0 ] || { echo "error: {vex} vpdp* would SIGILL on AVX-512 CPUs without AVX-VNNI" >&2; exit 1; }
fi
section_done

section install "install into build/install, build examples/app against it"
rm -rf build/install
cmake --install build --prefix build/install
PYTHONPATH=python "$python" examples/app/test_app.py --prefix build/install --work build/app-test
# The mv3 classifier built out of tree against the installed package (find_package(kiln)), run on
# scikit-image's photos with mobilenet_v3_small and checked against PyTorch eager: mv3_portable.kiln
# and, when the xnnpack delegate is built, mv3_xnnpack.kiln (the whole model as one XNNPACK segment).
rm -rf build/mv3-out-of-tree
cmake -S examples/mv3 -B build/mv3-out-of-tree -G Ninja -DCMAKE_PREFIX_PATH="$root/build/install"
cmake --build build/mv3-out-of-tree
mv3_backends=$(PYTHONPATH=python "$python" -c \
  'import kiln; print(" ".join(["portable"] + [b for b in kiln._kiln.backend_names() if b == "xnnpack"]))')
echo "mv3 out-of-tree backends: $mv3_backends"
# shellcheck disable=SC2086  # one word per backend
PYTHONPATH=python "$python" examples/mv3/demo.py --models mobilenet_v3_small --runs 1 --backends $mv3_backends \
  --classify build/mv3-out-of-tree/classify --out-dir build/mv3-out-of-tree/out
# classify built with kiln::runtime alone (-DKILN_EXAMPLE_BACKENDS=): the portable program still
# classifies, the xnnpack one fails with NotFound naming the backend (it is not linked).
rm -rf build/mv3-runtime-only
cmake -S examples/mv3 -B build/mv3-runtime-only -G Ninja -DCMAKE_PREFIX_PATH="$root/build/install" -DKILN_EXAMPLE_BACKENDS=
cmake --build build/mv3-runtime-only
photo=$("$python" -c 'import skimage, os; print(os.path.join(skimage.data.data_dir, "chelsea.png"))')
build/mv3-runtime-only/classify build/mv3-out-of-tree/out/mobilenet_v3_small_portable.kiln "$photo" --runs 1 > /dev/null
if [ -f build/mv3-out-of-tree/out/mobilenet_v3_small_xnnpack.kiln ]; then
  if msg=$(build/mv3-runtime-only/classify build/mv3-out-of-tree/out/mobilenet_v3_small_xnnpack.kiln "$photo" --runs 1 2>&1); then
    echo "error: classify without kiln::backend_xnnpack ran an xnnpack program" >&2; exit 1
  fi
  case "$msg" in *NotFound*"'xnnpack'"*) echo "runtime-only classify, xnnpack program: ${msg##*$'\n'}" ;;
    *) echo "error: expected NotFound naming 'xnnpack', got: $msg" >&2; exit 1 ;; esac
fi
# The diffusion example's generate, built out of tree against the installed package too.
rm -rf build/diffusion-out-of-tree
cmake -S examples/diffusion -B build/diffusion-out-of-tree -G Ninja -DCMAKE_PREFIX_PATH="$root/build/install"
cmake --build build/diffusion-out-of-tree
build/diffusion-out-of-tree/generate --help > /dev/null
section_done

section package "pip wheel . into build-wheel/, install into a fresh virtualenv, smoke test outside the tree"
# The wheel is built with the project virtualenv's scikit-build-core, pybind11 and mlx (pinned; no
# build isolation, so nothing is fetched to build it) and the same compiler as build/ (ccache hits).
rm -rf build-wheel/dist
CC=$(sed -n 's/^CMAKE_C_COMPILER:[A-Z]*=//p' build/CMakeCache.txt) \
CXX=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' build/CMakeCache.txt) \
CMAKE_C_COMPILER_LAUNCHER=$(command -v ccache || true) CMAKE_CXX_COMPILER_LAUNCHER=$(command -v ccache || true) \
CMAKE_BUILD_PARALLEL_LEVEL=$jobs \
  "$python" -m pip wheel . --no-build-isolation --no-deps -q -w build-wheel/dist \
    --config-settings=build-dir=build-wheel
wheel=$(ls build-wheel/dist/kiln-*.whl)
echo "wheel: $wheel ($(du -h "$wheel" | cut -f1))"
pkg_tmp=$(mktemp -d)
trap 'rc=$?; rm -rf "$pkg_tmp"; if [ $rc -ne 0 ]; then printf "\n*** scripts/test.sh: FAILED in section \"%s\" (exit %d)\n" "$current" $rc >&2; fi' EXIT
python3 -m venv "$pkg_tmp/venv"
"$pkg_tmp/venv/bin/pip" install -q "$wheel"   # and its dependencies from PyPI: numpy, mlx
# PyTorch (for kiln.export) is not a dependency of the wheel (several GB; `pip install kiln[export]`
# would fetch it): the fresh virtualenv reads it from the project's virtualenv through a .pth file
# appended after its own site-packages, so kiln, numpy and mlx still resolve to the fresh install.
site=$("$pkg_tmp/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/zz_kiln_ci_torch.pth"
mkdir -p "$pkg_tmp/work"
(cd "$pkg_tmp/work" && "$pkg_tmp/venv/bin/python" "$root/tests/package/smoke.py" --work "$pkg_tmp/work" --source-root "$root")
section_done

for s in sanitizers fuzz; do
  if skipped "$s"; then continue; fi
  if [ -f "scripts/$s.sh" ]; then
    section "$s" "bash scripts/$s.sh"
    bash "scripts/$s.sh"
    section_done
  else
    summary+=("$(printf '%-12s    -   not present (scripts/%s.sh)' "$s" "$s")")
  fi
done

if ! skipped cross; then
  section cross "bash scripts/cross-test.sh aarch64 (C++ suite under qemu-aarch64, NEON target)"
  bash scripts/cross-test.sh aarch64
  section_done
fi

current=""
printf '\n==================== summary ====================\n'
printf '%s\n' "${summary[@]}"
printf 'all tests passed in %ss\n' $(( $(date +%s) - start_all ))
