#!/usr/bin/env bash
# Installs the OpenHands SDK agent (openhands-sdk + openhands-tools, pinned with every dependency by
# harnesses/openhands.txt) into its own venv, .harnesses/openhands-venv. `make harnesses-openhands` calls
# it. Not part of `make harnesses`: on Debian 12 it costs 4.5-9 min and ~930 MB (see docs/harnesses.md).
#
# openhands-sdk needs Python >= 3.12 (it uses PEP 695 syntax; 3.11 cannot even parse it). The interpreter:
#   1. OPENHANDS_PYTHON, else python3.13 / python3.12 on PATH: a plain venv on it;
#   2. else (Debian 12 ships 3.11 only): Debian 13's python3.13 from the Debian registry, in a private
#      minimal root built with debootstrap (as root) in .harnesses/openhands-python. Its binaries need
#      Debian 13's glibc, so the venv gets a COPY of the interpreter whose ELF interpreter and rpath
#      (patchelf, also from that root) point into the root: it loads the root's own dynamic loader and
#      libraries, runs directly (pip's build subprocesses re-execute it), and the host's glibc and packages
#      stay untouched; the programs the agent runs are the host's.
#
# Idempotent: a stamp (hash of this script and the requirements) in the venv makes a second run return at
# once. Pass --force to reinstall.
#
# Environment: HARNESSES_DIR (default .harnesses), OPENHANDS_PYTHON, DEBIAN_MIRROR (default: the host's
# apt mirror, else http://deb.debian.org/debian).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${HARNESSES_DIR:-$ROOT/.harnesses}"
VENV="$DEST/openhands-venv"
DEBIAN_ROOT="$DEST/openhands-python"
REQUIREMENTS="$ROOT/harnesses/openhands.txt"
STAMP="$VENV/.lodestar-install-stamp"
SUITE=trixie

force=0
[[ "${1:-}" == "--force" ]] && force=1
want="$(cat "$0" "$REQUIREMENTS" | sha256sum | cut -c1-16)"
if [[ $force -eq 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$want" ]]; then
  echo "openhands: up to date in $VENV"
  exit 0
fi

system_python() {
  local candidate
  for candidate in "${OPENHANDS_PYTHON:-}" python3.13 python3.12; do
    [[ -n "$candidate" ]] || continue
    if command -v "$candidate" >/dev/null \
      && "$candidate" -c 'import sys, venv; sys.exit(sys.version_info < (3, 12))' 2>/dev/null; then
      command -v "$candidate"
      return 0
    fi
  done
}

host_mirror() {
  local uri
  uri="$(grep -hoE '^URIs: *http[^ ]*/debian/?$' /etc/apt/sources.list.d/*.sources 2>/dev/null | head -1 | sed 's/^URIs: *//')"
  echo "${DEBIAN_MIRROR:-${uri:-http://deb.debian.org/debian}}"
}

# A Debian 13 root with python3 (3.13), pip's wheel and patchelf, built once.
INCLUDE=python3,python3-pip-whl,patchelf
build_debian_root() {
  if [[ -x "$DEBIAN_ROOT/usr/bin/python3.13" && "$(cat "$DEBIAN_ROOT/.lodestar-complete" 2>/dev/null)" == "$INCLUDE" ]]; then
    return 0
  fi
  [[ "$(id -u)" == 0 ]] || { echo "openhands: no Python >= 3.12 here, and building one needs root (debootstrap)" >&2; exit 1; }
  command -v debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
  local mirror
  mirror="$(host_mirror)"
  echo "openhands: no Python >= 3.12 here: building a Debian 13 root with python3.13 ($mirror)"
  rm -rf "$DEBIAN_ROOT"
  debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$DEBIAN_ROOT" "$mirror" >/dev/null
  rm -rf "$DEBIAN_ROOT/var/cache/apt/archives"/*.deb
  echo "$INCLUDE" >"$DEBIAN_ROOT/.lodestar-complete"
}

# Run one of the root's programs with the root's loader and libraries.
in_root() {
  local libs="$DEBIAN_ROOT/usr/lib/x86_64-linux-gnu:$DEBIAN_ROOT/lib/x86_64-linux-gnu"
  "$DEBIAN_ROOT/lib64/ld-linux-x86-64.so.2" --library-path "$libs" "$@"
}

begin=$(date +%s)
rm -rf "$VENV"
python="$(system_python)"
if [[ -n "$python" ]]; then
  echo "openhands: installing into $VENV ($("$python" --version 2>&1))"
  "$python" -m venv "$VENV"
else
  build_debian_root
  in_root "$DEBIAN_ROOT/usr/bin/python3.13" -m venv --without-pip "$VENV"
  rm -f "$VENV/bin/python3.13"
  cp "$DEBIAN_ROOT/usr/bin/python3.13" "$VENV/bin/python3.13"
  # Two calls, rpath first: patchelf 0.18 given both at once (or the interpreter first) writes a binary
  # that segfaults at start (Debian's python3.13 is not PIE).
  in_root "$DEBIAN_ROOT/usr/bin/patchelf" --force-rpath \
    --set-rpath "$DEBIAN_ROOT/usr/lib/x86_64-linux-gnu:$DEBIAN_ROOT/lib/x86_64-linux-gnu" "$VENV/bin/python3.13"
  in_root "$DEBIAN_ROOT/usr/bin/patchelf" --set-interpreter "$DEBIAN_ROOT/lib64/ld-linux-x86-64.so.2" \
    "$VENV/bin/python3.13"
  wheel="$(ls "$DEBIAN_ROOT"/usr/share/python-wheels/pip-*.whl | head -1)"
  "$VENV/bin/python" "$wheel/pip" install --quiet --disable-pip-version-check --no-input "$wheel"
  echo "openhands: installing into $VENV ($("$VENV/bin/python" --version 2>&1) from Debian 13)"
fi
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$REQUIREMENTS"

check_home="$(mktemp -d)"
trap 'rm -rf "$check_home"' EXIT
version="$(cd "$check_home" && HOME="$check_home" OPENHANDS_SUPPRESS_BANNER=1 timeout 300 "$VENV/bin/python" -c '
import importlib.metadata as m
import openhands.sdk, openhands.tools.preset.default
print(m.version("openhands-sdk"), m.version("openhands-tools"))' </dev/null 2>&1 | tail -1)" || {
  echo "openhands: import check failed after install: $version" >&2
  exit 1
}
echo "$want" >"$STAMP"
size="$(du -shc "$VENV" "$([[ -d "$DEBIAN_ROOT" ]] && echo "$DEBIAN_ROOT" || echo "$VENV")" | tail -1 | cut -f1)"
echo "openhands: openhands-sdk/tools $version installed in $(( $(date +%s) - begin ))s, $size"
