#!/usr/bin/env bash
# Installs torch 2.13.0 into a virtualenv: the CUDA build on a machine with an NVIDIA GPU, the CPU build
# everywhere else. Usage: scripts/install-torch.sh VENV_PYTHON (the Makefile's venv target calls it).
#
# Why a script: PyPI's Linux wheel `torch==2.13.0` IS the CUDA build (several GB of nvidia-* packages); the
# CPU build is `2.13.0+cpu`, published on PyTorch's own CPU index, not on PyPI.
#   - `nvidia-smi` on PATH: `pip install torch==2.13.0` (the CUDA build from PyPI).
#   - no GPU, and pip's configured sources already resolve `torch==2.13.0` to a `+cpu` wheel (a local
#     wheelhouse through find-links, as on the project's development machines, which reach PyPI only): that
#     wheel, with the plain pin (checked with `pip install --dry-run`, which downloads no wheel).
#   - no GPU otherwise: `torch==2.13.0+cpu` from TORCH_CPU_INDEX_URL (default
#     https://download.pytorch.org/whl/cpu), ~200 MB instead of the CUDA build.
# Does nothing when the venv already has torch 2.13.0.
set -euo pipefail

PY="${1:?usage: install-torch.sh VENV_PYTHON}"
VERSION="2.13.0"
CPU_INDEX="${TORCH_CPU_INDEX_URL:-https://download.pytorch.org/whl/cpu}"

installed="$("$PY" -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || true)"
if [[ "$installed" == "$VERSION" || "$installed" == "$VERSION+"* ]]; then
  echo "install-torch: torch $installed already installed"
  exit 0
fi

if command -v nvidia-smi >/dev/null 2>&1; then
  echo "install-torch: NVIDIA GPU found: torch==$VERSION (CUDA build) from PyPI"
  exec "$PY" -m pip install -q "torch==$VERSION"
fi

resolved="$("$PY" -m pip install -q --dry-run --ignore-installed --no-deps --report - "torch==$VERSION" 2>/dev/null |
  "$PY" -c 'import json, sys; print(json.load(sys.stdin)["install"][0]["metadata"]["version"])' 2>/dev/null || true)"
if [[ "$resolved" == *"+cpu" ]]; then
  echo "install-torch: no GPU; pip's configured sources serve torch $resolved"
  exec "$PY" -m pip install -q "torch==$VERSION"
fi
echo "install-torch: no GPU: torch==$VERSION+cpu from $CPU_INDEX"
exec "$PY" -m pip install -q --index-url "$CPU_INDEX" "torch==$VERSION+cpu"
