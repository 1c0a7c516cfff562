#!/usr/bin/env bash
# Installs a Chromium for the dashboard's browser test (tests/dashboard/test_browser.py), unless one is there:
#   - apt's `chromium` deb where apt offers one (Debian: ~290 MB with its dependencies);
#   - else (Ubuntu, whose `chromium-browser` deb is only a stub that installs the snap) Playwright's own
#     Chromium build: `playwright install --with-deps chromium` from the venv's Playwright (the dev extra),
#     into ~/.cache/ms-playwright, its system libraries with apt (~180 MB + libraries; needs Playwright's
#     download host, cdn.playwright.dev, reachable).
# The test takes whichever exists ($LODESTAR_CHROMIUM first, then /usr/bin/chromium, then Playwright's).
# Usage: scripts/install-chromium.sh VENV_PYTHON (the Makefile's test-deps target calls it).
set -euo pipefail

PY="${1:?usage: install-chromium.sh VENV_PYTHON}"
SUDO=""
[[ "$(id -u)" == 0 ]] || SUDO="sudo"

playwright_chromium() {
  "$PY" - <<'EOF' 2>/dev/null
import os, sys
from playwright.sync_api import sync_playwright
with sync_playwright() as playwright:
    sys.exit(0 if os.path.exists(playwright.chromium.executable_path) else 1)
EOF
}

command -v chromium >/dev/null && exit 0
playwright_chromium && exit 0
$SUDO apt-get update -qq
if [[ "$(apt-cache policy chromium 2>/dev/null)" =~ Candidate:\ [0-9] ]]; then
  echo "install-chromium: chromium from apt"
  $SUDO apt-get install -y -qq chromium
else
  echo "install-chromium: apt has no chromium deb: Playwright's Chromium (playwright install --with-deps)"
  # Playwright's own Node.js driver needs libatomic1, which a minimal Ubuntu lacks (found on ubuntu 24.04).
  $SUDO apt-get install -y -qq libatomic1
  "$PY" -m playwright install --with-deps chromium
fi
