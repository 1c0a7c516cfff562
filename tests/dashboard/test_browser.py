"""The dashboard in a real browser: a Chromium driven by Playwright for Python: $LODESTAR_CHROMIUM, else
Debian's (/usr/bin/chromium), else Playwright's own build (Ubuntu: scripts/install-chromium.sh). Opens the
finished run of `stack`, checks the runs table, a training curve with one point per step, a session's calls
and a call's token view, and writes screenshots as test artifacts (`<tmp>/screenshots/`, or
$LODESTAR_SCREENSHOT_DIR when set: docs/dashboard.md's images come from there)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.dashboard.stack import LARGE_CALLS, STEPS, DashboardStack

SYSTEM_CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 15_000


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail("Playwright for Python missing: pip install playwright (the dev extra)", pytrace=False)
    with sync_playwright() as playwright:
        chromium = _chromium(Path(playwright.chromium.executable_path))
        launched = playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


def _chromium(playwright_own: Path) -> Path:
    """$LODESTAR_CHROMIUM, else Debian's Chromium, else Playwright's own build; fails when none exists."""
    for candidate in (os.environ.get("LODESTAR_CHROMIUM"), SYSTEM_CHROMIUM, playwright_own):
        if candidate and Path(candidate).exists():
            return Path(candidate)
    pytest.fail("Chromium missing: `make test-deps` (scripts/install-chromium.sh)", pytrace=False)


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return Path(os.environ.get("LODESTAR_SCREENSHOT_DIR") or tmp_path_factory.mktemp("screenshots"))


def _open(page: Any, url: str) -> None:
    page.goto(url, timeout=TIMEOUT_MS)
    page.wait_for_selector("body[data-ready='1']", timeout=TIMEOUT_MS)
    assert page.locator("#error").count() == 0, page.locator("#error").inner_text()


@pytest.mark.slow
def test_a_finished_run_in_the_browser(stack: DashboardStack, browser: Any, screenshots: Path) -> None:
    assert stack.run is not None
    run = stack.run
    screenshots.mkdir(parents=True, exist_ok=True)
    page = browser.new_page(viewport={"width": 1400, "height": 1000})
    page.set_default_timeout(TIMEOUT_MS)
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))

    _open(page, stack.url)
    row = page.locator(f"#runs-table tr[data-run-id='{run.run_id}']")
    assert row.locator("td").nth(1).inner_text() == "completed"
    assert "3/3" in row.locator("td").nth(2).inner_text()
    page.screenshot(path=str(screenshots / "runs.png"), full_page=True)

    row.locator("a").first.click()
    page.wait_for_url(f"**/runs/{run.run_id}", timeout=TIMEOUT_MS)
    page.wait_for_selector(".chart[data-title='reward'] canvas", timeout=TIMEOUT_MS)
    reward = page.locator(".chart[data-title='reward']")
    assert reward.get_attribute("data-points") == str(STEPS)
    assert page.locator(".chart").count() >= 8
    assert page.locator("#groups-table tbody tr").count() == 3
    failures = page.locator("#failures-table tbody tr").inner_text()
    assert "infra_failed: runtime: container" in failures
    assert "http" not in failures
    page.screenshot(path=str(screenshots / "run.png"), full_page=True)

    page.locator(f".sample[data-session-id='{run.chained_session}'] a").click()
    page.wait_for_url(f"**/sessions/{run.chained_session}", timeout=TIMEOUT_MS)
    page.wait_for_selector("#calls-table", timeout=TIMEOUT_MS)
    assert page.locator("#calls-table tbody tr").count() == 3
    assert "continues #0" in page.locator("#calls-table tr[data-sequence='1']").inner_text()
    assert "new chain (drift)" in page.locator("#calls-table tr[data-sequence='2']").inner_text()
    assert "agent stdout of task-0/0" in page.locator("#stdout").inner_text()
    page.screenshot(path=str(screenshots / "session.png"), full_page=True)

    page.locator("#calls-table tr[data-sequence='1'] a").click()
    page.wait_for_url(f"**/sessions/{run.chained_session}/calls/1", timeout=TIMEOUT_MS)
    page.wait_for_selector("#sampled-tokens .tok", timeout=TIMEOUT_MS)
    sampled = page.locator("#sampled-tokens .tok.sampled")
    assert page.locator("#sampled-tokens").inner_text() == "Running the tests now: 1 failed, 3 passed."
    assert sampled.first.get_attribute("data-logprob") == "0.0000"
    assert sampled.nth(1).get_attribute("data-logprob") == "-2.3333"
    assert page.locator("#prompt-tokens .tok.shared").count() > 0
    assert page.locator("#prompt-tokens .tok.new").count() > 0
    assert "extends call #0" in page.locator("#chain").inner_text()
    assert "null" not in page.locator("main").inner_text()
    page.screenshot(path=str(screenshots / "call.png"), full_page=True)

    _open(page, f"{stack.url}sessions/{run.large_session}?offset=250&limit=100")
    assert page.locator("#calls-table tbody tr").count() == LARGE_CALLS - 250
    assert f"of {LARGE_CALLS}" in page.locator(".pager").first.inner_text()

    page.goto(f"{stack.url}sessions/no-such-session", timeout=TIMEOUT_MS)
    assert "404" in page.locator("h1").inner_text()

    assert not errors, errors
    assert all(url.startswith(stack.url) for url in requests), [u for u in requests if not u.startswith(stack.url)]
    page.close()
    shutil.copy(screenshots / "run.png", screenshots / "dashboard.png")
