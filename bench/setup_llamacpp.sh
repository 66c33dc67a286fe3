#!/usr/bin/env bash
# Creates (once) the virtualenv that bench/llm.py uses to run llama.cpp, from the pinned
# bench/requirements-llamacpp.txt. llama-cpp-python is built from its source distribution (never a
# prebuilt wheel: --no-binary), which compiles the llama.cpp it vendors natively for this CPU
# (GGML_NATIVE=ON is llama.cpp's default, so -march=native). The venv lives outside the checkout,
# one per requirements hash, and is reused on later runs. KILN_LLAMACPP_VENV overrides the location;
# CMAKE_BUILD_PARALLEL_LEVEL (default 2) bounds the compile jobs.
# Prints the virtualenv path on its last line; exits non-zero (with pip's error) on failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
req="$here/requirements-llamacpp.txt"
hash=$(sha256sum "$req" | cut -c1-12)
venv=${KILN_LLAMACPP_VENV:-${XDG_DATA_HOME:-$HOME/.local/share}/kiln/bench-llamacpp-venv-$hash}
if [ ! -f "$venv/.kiln-complete" ]; then
  parent=$(dirname "$venv")
  mkdir -p "$parent"
  avail_kb=$(df -Pk "$parent" | awk 'NR==2 {print $4}')
  echo "[setup_llamacpp] free space on $(df -Ph "$parent" | awk 'NR==2 {print $6}'): $((avail_kb / 1048576)) GiB" >&2
  if [ "$avail_kb" -lt $((2 * 1048576)) ]; then
    echo "[setup_llamacpp] need about 2 GiB free to build llama-cpp-python; not installing" >&2
    exit 1
  fi
  for tool in cmake c++; do
    command -v "$tool" >/dev/null || { echo "[setup_llamacpp] $tool not found (needed to build llama.cpp)" >&2; exit 1; }
  done
  echo "[setup_llamacpp] creating $venv (compiles llama.cpp from source: several minutes once)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >&2
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    "$venv/bin/pip" install -q --no-binary llama-cpp-python -r "$req" >&2
  "$venv/bin/python" -c "import llama_cpp, gguf; print('[setup_llamacpp] llama-cpp-python', llama_cpp.__version__, '|', llama_cpp.llama_print_system_info().decode())" >&2
  touch "$venv/.kiln-complete"
fi
echo "$venv"
