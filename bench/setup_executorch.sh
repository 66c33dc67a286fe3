#!/usr/bin/env bash
# Creates (once) the virtualenv that bench/ uses to run ExecuTorch, from the pinned
# bench/requirements-executorch.txt. ExecuTorch pins its own torch, so it cannot share Kiln's
# virtualenv. torch wheels are several GB: the venv lives outside the checkout, one per
# requirements hash, and is reused on later runs. KILN_ET_VENV overrides the location.
# Prints the virtualenv path on its last line; exits non-zero (with pip's error) on failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
req="$here/requirements-executorch.txt"
hash=$(sha256sum "$req" | cut -c1-12)
venv=${KILN_ET_VENV:-${XDG_DATA_HOME:-$HOME/.local/share}/kiln/bench-et-venv-$hash}
if [ ! -f "$venv/.kiln-complete" ]; then
  parent=$(dirname "$venv")
  mkdir -p "$parent"
  # torch + its CUDA dependency wheels from PyPI take about 8 GB once installed.
  avail_kb=$(df -Pk "$parent" | awk 'NR==2 {print $4}')
  echo "[setup_executorch] free space on $(df -Ph "$parent" | awk 'NR==2 {print $6}'): $((avail_kb / 1048576)) GiB" >&2
  if [ "$avail_kb" -lt $((10 * 1048576)) ]; then
    echo "[setup_executorch] need about 10 GiB free for torch + executorch; not installing" >&2
    exit 1
  fi
  echo "[setup_executorch] creating $venv (torch is large: this takes a while once)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q -r "$req" >&2
  "$venv/bin/python" -c "import executorch.runtime, torch; print('[setup_executorch] executorch ok, torch', torch.__version__)" >&2
  touch "$venv/.kiln-complete"
fi
echo "$venv"
