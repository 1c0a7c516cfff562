#!/usr/bin/env bash
# Refresh the dashboard's vendored charting library from npm: uPlot (MIT), pinned in package.json.
# The dashboard serves these files itself (no CDN: it works offline); they are committed, so installing
# lodestar needs no Node.js. To upgrade: change the pin in package.json, `npm install`, run this, commit.
set -euo pipefail
cd "$(dirname "$0")/.."
src=node_modules/uplot
dst=lodestar_app/dashboard/static/vendor
[ -f "$src/package.json" ] || { echo "node_modules/uplot missing: run 'npm ci' (make node-tools)" >&2; exit 1; }
mkdir -p "$dst"
cp "$src/dist/uPlot.iife.min.js" "$src/dist/uPlot.min.css" "$dst/"
cp "$src/LICENSE" "$dst/uPlot.LICENSE"
version=$(node -p "require('./$src/package.json').version")
echo "$version" > "$dst/uPlot.VERSION"
echo "vendored uPlot $version into $dst"
