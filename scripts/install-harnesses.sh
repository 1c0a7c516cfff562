#!/usr/bin/env bash
# Installs the five real coding-agent harnesses (Claude Code, Codex, Qwen Code, Pi, Gemini CLI), pinned
# by harnesses/package.json + harnesses/package-lock.json, into the git-ignored folder .harnesses/
# (binaries in .harnesses/node_modules/.bin). `make harnesses` calls it; `make test` runs it first.
#
# Idempotent: a stamp (hash of this script and both harness manifests) plus a present binary for every
# harness makes a second run return in well under a second. Pass --force (or delete .harnesses) to
# reinstall. Needs only node + npm and the npm registry (or a warm npm cache).
#
# Environment:
#   HARNESSES_DIR   install folder (default .harnesses in the repository root)
#   NPM             npm executable (default npm)
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
#   - Codex likewise resolves a per-platform package (npm:@openai/codex@<v>-linux-x64).
#   - Each binary is checked with `--version` (private HOME, stdin=/dev/null) after installing, so a
#     placeholder that never got its native binary fails the install instead of the tests.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST="${HARNESSES_DIR:-$ROOT/.harnesses}"
NPM="${NPM:-npm}"
STAMP="$DEST/.lodestar-install-stamp"
BINS=(claude codex qwen pi gemini)

force=0
[[ "${1:-}" == "--force" ]] && force=1

want_stamp="$(cat "$0" "$ROOT/harnesses/package.json" "$ROOT/harnesses/package-lock.json" | sha256sum | cut -c1-16)"

all_present() {
  local b
  for b in "${BINS[@]}"; do
    [[ -x "$DEST/node_modules/.bin/$b" ]] || return 1
  done
}

if [[ $force -eq 0 && -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]] && all_present; then
  echo "harnesses: up to date in $DEST"
  exit 0
fi

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
echo "harnesses: installed in $(( $(date +%s) - start ))s, $(du -sh "$DEST" | cut -f1)"
