#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine to the result table:
#   1. scripts/setup.sh: system packages (apt-get) and the Python virtualenv (its path is the last
#      line it prints);
#   2. configure and build Release into build/ (the classify example and the Python binding);
#   3. examples/mv3/demo.py with the virtualenv's python and PYTHONPATH=python: export
#      mobilenet_v3_small, mobilenet_v3_large and resnet18 to out/mv3/ (one program per built
#      backend: portable, xnnpack, mlx, plus "any" = mlx else xnnpack in one file), classify three
#      photos with the C++ binary and compare every logit with PyTorch eager.
# Arguments are passed to demo.py (e.g. --weights-dir DIR with torchvision state dicts <model>.pth;
# without it the weights are random and the class names meaningless). Exit status: demo.py's.
# KILN_BUILD_DIR overrides the build folder (default build/); KILN_JOBS the build parallelism.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${KILN_BUILD_DIR:-$root/build}
jobs=${KILN_JOBS:-$(nproc)}

venv=$("$root/scripts/setup.sh" | tail -n 1)
if [ ! -x "$venv/bin/python" ]; then
  echo "demo.sh: scripts/setup.sh did not print a virtualenv path (got '$venv')" >&2
  exit 1
fi
export KILN_VENV=$venv   # anything below that calls setup.sh gets the same virtualenv
echo "[demo] virtualenv: $venv" >&2

generator=()
if [ ! -f "$build/CMakeCache.txt" ] && command -v ninja > /dev/null; then generator=(-G Ninja); fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
  -DPython_EXECUTABLE="$venv/bin/python" -DKILN_BUILD_EXAMPLES=ON -DKILN_BUILD_PYTHON=ON >&2
cmake --build "$build" -j "$jobs" --target classify _kiln >&2

cd "$root"
PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" exec "$venv/bin/python" "$root/examples/mv3/demo.py" \
  --build-dir "$build" "$@"
