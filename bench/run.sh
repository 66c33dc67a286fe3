#!/usr/bin/env bash
# One command for the whole benchmark: sets up what it needs and writes docs/benchmarks.md.
#   bash bench/run.sh                   # all models, 1 and 2 threads, 2 rounds
#   bash bench/run.sh --models resnet18 --rounds 1      # extra arguments go to bench/run.py
#   bash bench/run.sh --kiln-target avx2                # + Kiln cpu kernels at KILN_CPU_TARGET=avx2
# The report starts with the CPU model, its SIMD features and the cpu kernel target Kiln chose.
# Steps: Kiln's system packages + virtualenv (scripts/setup.sh), a Release build of Kiln in
# build/ (kiln CLI + Python binding), ExecuTorch's own virtualenv (bench/setup_executorch.sh;
# if it cannot be set up, the table says why), then bench/run.py.
# Not run by CI. Takes about 10-20 minutes on a 2-core machine (plus the one-time installs).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
venv=$(bash scripts/setup.sh | tail -n 1)
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DPython_EXECUTABLE="$venv/bin/python" >/dev/null
cmake --build build -j"$(nproc)" --target kiln _kiln >&2
et_args=()
if et_venv=$(bash bench/setup_executorch.sh 2> build/bench-et-setup.log | tail -n 1) && [ -x "$et_venv/bin/python" ]; then
  et_args=(--et-python "$et_venv/bin/python")
else
  err=$(grep -v '^\[setup_executorch\]' build/bench-et-setup.log | grep -i 'error' | tail -n 1 || true)
  [ -z "$err" ] && err=$(tail -n 1 build/bench-et-setup.log)
  echo "[bench] ExecuTorch is not available: $err" >&2
  et_args=(--et-error "bench/setup_executorch.sh failed: $err")
fi
PYTHONPATH="$root/python" exec "$venv/bin/python" bench/run.py --kiln-cli build/tools/kiln "${et_args[@]}" "$@"
