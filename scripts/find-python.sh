#!/usr/bin/env bash
# Prints the path of a Python >= 3.11 that can make a virtualenv (the project needs 3.11; the Makefile's
# venv target, scripts/setup-vllm-venv.sh and the harness venvs build from it), or fails saying what to do.
#
# Which one (the first that is >= 3.11):
#   1. $PYTHON when set (`make PYTHON=/opt/python3.12/bin/python3 run`); an older one is an error, not skipped;
#   2. python3, python3.13, python3.12, python3.11 on PATH;
#   3. the one `--install` put under .tools/python (uv's managed CPython).
#
# With --install, when none exists, installs one first:
#   - apt (Debian/Ubuntu): python3.X and python3.X-venv for the newest X in 13, 12, 11 that apt offers
#     (Ubuntu 22.04: python3.11 from jammy-updates/universe; Debian 12's and Ubuntu 24.04's python3 already
#     qualify); through sudo when not root;
#   - else uv from PyPI (in its own venv, .tools/uv-venv) and `uv python install 3.11` into .tools/python
#     (python-build-standalone from GitHub: needs that download reachable).
# It also installs python3.X-venv when the chosen apt Python lacks ensurepip (`python -m venv` needs it).
# Set PYTHON_NO_APT=1 to skip apt and go straight to uv.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
MIN_MINOR=11
SUDO=""
[[ "$(id -u)" == 0 ]] || SUDO="sudo"

say() { echo "find-python: $*" >&2; }

# A Python >= 3.11 (prints its absolute path), else fails.
qualifies() {
  local exe
  exe="$(command -v "$1" 2>/dev/null)" || return 1
  "$exe" -c "import sys; sys.exit(0 if sys.version_info >= (3, $MIN_MINOR) else 1)" 2>/dev/null || return 1
  echo "$exe"
}

find_python() {
  if [[ -n "${PYTHON:-}" ]]; then
    qualifies "$PYTHON" && return 0
    say "PYTHON=$PYTHON: not found, or older than 3.$MIN_MINOR"
    exit 1
  fi
  local candidate
  for candidate in python3 python3.13 python3.12 python3.11; do
    qualifies "$candidate" && return 0
  done
  candidate="$(ls -d "$TOOLS"/python/cpython-3.*/bin/python3 2>/dev/null | sort -V | tail -1 || true)"
  [[ -n "$candidate" ]] && qualifies "$candidate" && return 0
  return 1
}

# apt-get update unless its lists are under an hour old (system-deps has just updated them on a fresh machine).
apt_update() {
  [[ -n "$(find /var/lib/apt/lists -maxdepth 1 -name '*_Packages*' -mmin -60 2>/dev/null | head -1)" ]] ||
    $SUDO apt-get update -qq
}

# (grep reads all of apt-cache's output: with pipefail, `grep -q` would fail the pipe on SIGPIPE.)
apt_has() { [[ "$(apt-cache policy "$1" 2>/dev/null)" =~ Candidate:\ [0-9] ]]; }

install_with_apt() {
  command -v apt-get >/dev/null || return 1
  [[ -z "${PYTHON_NO_APT:-}" ]] || return 1
  apt_update
  local minor
  for minor in 13 12 $MIN_MINOR; do
    if apt_has "python3.$minor" && apt_has "python3.$minor-venv"; then
      say "installing python3.$minor and python3.$minor-venv with apt"
      $SUDO apt-get install -y -qq "python3.$minor" "python3.$minor-venv" >/dev/null
      return 0
    fi
  done
  say "apt offers no python3.1[1-3] with its -venv package"
  return 1
}

install_with_uv() {
  local base
  base="$(command -v python3 || true)"
  [[ -n "$base" ]] || { say "no python3 at all to install uv with: install one (apt-get install python3)"; exit 1; }
  say "installing uv from PyPI into $TOOLS/uv-venv, then CPython 3.$MIN_MINOR into $TOOLS/python"
  if [[ ! -x "$TOOLS/uv-venv/bin/uv" ]]; then
    "$base" -m venv "$TOOLS/uv-venv" || {
      say "'$base -m venv' failed (Debian/Ubuntu: apt-get install python3-venv)"
      exit 1
    }
    "$TOOLS/uv-venv/bin/python" -m pip install -q "uv>=0.5"
  fi
  "$TOOLS/uv-venv/bin/uv" python install --install-dir "$TOOLS/python" "3.$MIN_MINOR" >&2
}

# The chosen interpreter must be able to make a venv: Debian/Ubuntu ship ensurepip in python3.X-venv.
ensure_venv_module() {
  local exe="$1" minor
  "$exe" -c 'import ensurepip, venv' 2>/dev/null && return 0
  minor="$("$exe" -c 'import sys; print(sys.version_info[1])')"
  if command -v apt-get >/dev/null && [[ "$exe" == /usr/bin/* ]]; then
    say "installing python3.$minor-venv with apt ($exe has no ensurepip)"
    apt_update
    if apt_has "python3.$minor-venv"; then
      $SUDO apt-get install -y -qq "python3.$minor-venv" >/dev/null
    else
      $SUDO apt-get install -y -qq python3-venv >/dev/null
    fi
    return 0
  fi
  say "$exe cannot make a venv (no ensurepip): install its venv module, or set PYTHON= to another"
  exit 1
}

if [[ "${1:-}" == "--install" ]]; then
  if [[ -n "${PYTHON:-}" ]]; then exe="$(find_python)"; ensure_venv_module "$exe"; echo "$exe"; exit 0; fi
  exe="$(find_python)" || { install_with_apt || install_with_uv; exe="$(find_python)"; } || {
    say "no Python >= 3.$MIN_MINOR after installing; set PYTHON=/path/to/python3.X"
    exit 1
  }
  ensure_venv_module "$exe"
  echo "$exe"
else
  find_python || {
    say "no Python >= 3.$MIN_MINOR (python3, python3.13/3.12/3.11, .tools/python): run 'make system-deps'" \
      "(installs one) or set PYTHON=/path/to/python3.X"
    exit 1
  }
fi
