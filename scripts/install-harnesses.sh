#!/usr/bin/env bash
# Installs the real coding-agent harnesses into the git-ignored folder .harnesses/. `make harnesses` calls
# it; `make test` runs it first.
#   - npm: Claude Code, Codex, Qwen Code, Pi, Gemini CLI, opencode, Continue CLI (cn) and Cline, pinned by harnesses/package.json +
#     harnesses/package-lock.json (binaries in .harnesses/node_modules/.bin);
#   - PyPI, each in its own venv: mini-swe-agent (.harnesses/mini-swe-agent-venv, pinned with every
#     dependency by harnesses/mini-swe-agent.txt), aider (.harnesses/aider-venv, harnesses/aider.txt) and
#     Open Interpreter (.harnesses/open-interpreter-venv, harnesses/open-interpreter.txt).
# The OpenHands SDK agent has its own installer and target (scripts/install-openhands.sh, make
# harnesses-openhands): it needs Python >= 3.12 and costs ~6 min and ~1 GB on Debian 12.
#
# Idempotent: a stamp per part (hash of this script and that part's manifests) plus its present binaries
# makes a second run return in well under a second. Pass --force (or delete .harnesses) to reinstall.
# Needs node + npm, python3 with venv, and the npm registry and PyPI (or warm caches).
#
# Environment:
#   HARNESSES_DIR   install folder (default .harnesses in the repository root)
#   NPM             npm executable (default npm)
#   PYTHON          interpreter for the mini-swe-agent venv (default python3)
#
# Pitfalls handled here:
#   - Claude Code 2.1.x ships a native binary in a per-platform optional dependency; its postinstall
#     hard-links it over bin/claude.exe. Install scripts must therefore run (no --ignore-scripts), and
#     optional dependencies must not be omitted. It declares node>=22 but the native binary does not use
#     node, so the EBADENGINE warning on node 20 is harmless.
#   - `npm ci` cannot be used: Qwen Code lists optional per-platform packages of @teddyzhu/clipboard
#     that were never published (404), so the lock file can never hold them and `npm ci` refuses it as
#     "out of sync". `npm install --no-save` with the lock in place installs the locked versions (with
#     their integrity hashes) and skips the missing optional ones; the pins are then checked below.
#   - Codex likewise resolves a per-platform package (npm:@openai/codex@<v>-linux-x64); Cline's native
#     binary is the optional @cline/cli-linux-x64, which its postinstall hard-links to bin/.cline (local only).
#   - Each binary is checked with `--version` (private HOME, stdin=/dev/null) after installing, so a
#     placeholder that never got its native binary fails the install instead of the tests.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${HARNESSES_DIR:-$ROOT/.harnesses}"
NPM="${NPM:-npm}"
STAMP="$DEST/.lodestar-install-stamp"
BINS=(claude codex qwen pi gemini opencode cn cline)

force=0
[[ "${1:-}" == "--force" ]] && force=1

want_stamp="$(cat "$0" "$ROOT/harnesses/package.json" "$ROOT/harnesses/package-lock.json" | sha256sum | cut -c1-16)"

all_present() {
  local b
  for b in "${BINS[@]}"; do
    [[ -x "$DEST/node_modules/.bin/$b" ]] || return 1
  done
}

install_npm() {
command -v "$NPM" >/dev/null || { echo "harnesses: npm not found (install Node.js >= 20)" >&2; exit 1; }
mkdir -p "$DEST"
cp "$ROOT/harnesses/package.json" "$ROOT/harnesses/package-lock.json" "$DEST/"
rm -f "$STAMP"
start=$(date +%s)
echo "harnesses: installing into $DEST (npm install from harnesses/package-lock.json)"
(cd "$DEST" && "$NPM" install --no-save --no-audit --no-fund --loglevel=error --include=optional)

# Every pinned package must be installed at exactly its pinned version.
(cd "$DEST" && node -e '
  const deps = require("./package.json").dependencies;
  let bad = 0;
  for (const [name, want] of Object.entries(deps)) {
    const got = require(`./node_modules/${name}/package.json`).version;
    if (got !== want) { console.error(`harnesses: ${name} is ${got}, pinned ${want}`); bad = 1; }
  }
  process.exit(bad);
')

check_home="$(mktemp -d)"
trap 'rm -rf "$check_home"' EXIT
for b in "${BINS[@]}"; do
  v="$(HOME="$check_home" DISABLE_AUTOUPDATER=1 timeout 60 "$DEST/node_modules/.bin/$b" --version </dev/null 2>&1 | tail -1)" || {
    echo "harnesses: $b --version failed after install" >&2
    exit 1
  }
  echo "harnesses: $b $v"
done
echo "$want_stamp" >"$STAMP"
echo "harnesses: npm harnesses installed in $(( $(date +%s) - start ))s, $(du -sh "$DEST/node_modules" | cut -f1)"
}

# install_venv NAME PYTHON REQUIREMENTS CHECK...: a fresh venv .harnesses/NAME-venv from a pinned
# requirements file, then CHECK (a command line run with the venv's python, private HOME) must succeed.
install_venv() {
  local name="$1" python="$2" requirements="$3"
  shift 3
  local venv="$DEST/$name-venv" stamp="$DEST/$name-venv/.lodestar-install-stamp" want
  want="$(cat "$0" "$requirements" | sha256sum | cut -c1-16)"
  if [[ $force -eq 0 && -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
    echo "harnesses: $name up to date in $venv"
    return 0
  fi
  local begin check_home version
  begin=$(date +%s)
  echo "harnesses: installing $name into $venv ($("$python" --version 2>&1), pip install -r ${requirements#"$ROOT"/})"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-input -r "$requirements"
  check_home="$(mktemp -d)"
  version="$(cd "$check_home" && HOME="$check_home" timeout 120 "$@" </dev/null 2>&1 | tail -1)" || {
    rm -rf "$check_home"
    echo "harnesses: $name check failed after install: $version" >&2
    exit 1
  }
  rm -rf "$check_home"
  echo "$want" >"$stamp"
  echo "harnesses: $name $version installed in $(( $(date +%s) - begin ))s, $(du -sh "$venv" | cut -f1)"
}

mkdir -p "$DEST"
if [[ $force -eq 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]] && all_present; then
  echo "harnesses: npm harnesses up to date in $DEST"
else
  install_npm
fi

install_venv mini-swe-agent "${PYTHON:-python3}" "$ROOT/harnesses/mini-swe-agent.txt" \
  env MSWEA_SILENT_STARTUP=1 MSWEA_CONFIGURED=true LITELLM_LOCAL_MODEL_COST_MAP=True \
  "$DEST/mini-swe-agent-venv/bin/python" -c 'import minisweagent; print(minisweagent.__version__)'

install_venv aider "${PYTHON:-python3}" "$ROOT/harnesses/aider.txt" \
  env LITELLM_LOCAL_MODEL_COST_MAP=True AIDER_CHECK_UPDATE=false AIDER_ANALYTICS=false \
  "$DEST/aider-venv/bin/aider" --version

install_venv open-interpreter "${PYTHON:-python3}" "$ROOT/harnesses/open-interpreter.txt" \
  env LITELLM_LOCAL_MODEL_COST_MAP=True DISABLE_TELEMETRY=true \
  "$DEST/open-interpreter-venv/bin/python" -c 'import importlib.metadata as m; print(m.version("open-interpreter"))'
