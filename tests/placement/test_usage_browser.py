"""The usage page in a real headless Chromium: the seeded numbers in its tables and
charts, the empty state, and nothing fetched from anywhere but the service.

Debian's ``chromium`` driven by Playwright (no browser download): the service runs
in-process on 127.0.0.1, the browser with a fresh profile and no background networking.
Screenshots are kept in test-artifacts/.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from testbed.usage import EMPTY_ORG, ORG, seeded_app

CHROMIUM = os.environ.get("O41_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-default-apps",
    "--disable-extensions",
    "--metrics-recording-only",
]

try:
    from playwright.async_api import Route, async_playwright

    HAVE_PLAYWRIGHT = True
except ImportError:  # reported below
    HAVE_PLAYWRIGHT = False

MISSING = (
    "needs Debian's chromium (apt-get install chromium) and playwright (pip install playwright)"
)
if not HAVE_PLAYWRIGHT or shutil.which(CHROMIUM) is None:
    if os.environ.get("CI"):
        raise RuntimeError(MISSING)  # CI must run it, not skip it
    pytestmark = pytest.mark.skip(reason=MISSING)


async def test_the_page_shows_the_seeded_usage(aiohttp_server: Any, tmp_path: Path) -> None:
    server = await aiohttp_server(seeded_app(), host="127.0.0.1")
    base = f"http://127.0.0.1:{server.port}"
    foreign: list[str] = []

    async def only_the_service(route: Route) -> None:
        if route.request.url.startswith(base + "/"):
            await route.continue_()
        else:
            foreign.append(route.request.url)
            await route.abort()

    ARTIFACTS.mkdir(exist_ok=True)
    async with async_playwright() as pw:
        browser = await pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh --user-data-dir
            executable_path=CHROMIUM,
            headless=True,
            args=ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            await browser.route("**/*", only_the_service)
            page = await browser.new_page()

            # the page asks for a token; the form keeps it in a cookie
            first = await page.goto(f"{base}/usage?organization={ORG}&window=24h")
            assert first is not None and first.status == 401
            await page.fill("textarea[name=token]", "token-team-a")
            await page.click("button[type=submit]")
            await page.wait_for_selector("#summary")
            assert page.url == f"{base}/usage?organization={ORG}&window=24h"

            summary = await page.inner_text("#summary")
            assert summary.startswith(
                "A location in azure/westeurope would have kept 500 GB local, about $24.62"
            )  # the net advice (tests/placement/test_usage_page.py says why)
            places = await page.locator("#places tbody tr").all_inner_texts()
            assert places[0].split("\t")[:2] == ["aws/us-west-2", "env"]
            assert "1.2 TB" in places[0] and "$24.00" in places[0]
            assert "$43.50" in places[1] and places[1].rstrip().endswith("5")  # warnings
            labels = await page.locator("#places-chart text").all_text_contents()
            assert "aws/us-west-2 (env)" in labels
            assert "1.2 TB left the region" in labels and "500 GB left the region" in labels

            matrix = await page.locator("#matrix-chart text").all_text_contents()
            assert {"800 GB", "2.1 TB", "1.0 GB"} <= set(matrix)
            row = await page.locator("#matrix tbody tr", has_text="from gcp").inner_text()
            assert "800 GB" in row and "$72.00" in row
            assert "100 GB" in await page.inner_text("#cross-region")

            sources = await page.locator("#sources-chart text").all_text_contents()
            assert "2.0 GB, 3 versions" in sources  # the unknown place
            await page.screenshot(path=str(ARTIFACTS / "usage-page.png"), full_page=True)

            # the week: us-west-2 is now where a location pays
            await page.click("nav a:text-is('7d')")
            await page.wait_for_url(f"{base}/usage?organization={ORG}&window=7d")
            assert "aws/us-west-2 would have kept 4.2 TB" in await page.inner_text("#summary")

            empty = await page.goto(f"{base}/usage?organization={EMPTY_ORG}")
            assert empty is not None and empty.status == 200
            text = await page.inner_text("#empty")
            assert f"No usage recorded for {EMPTY_ORG} in the last 7d" in text
            await page.screenshot(path=str(ARTIFACTS / "usage-page-empty.png"), full_page=True)
        finally:
            await browser.close()
    assert foreign == []
