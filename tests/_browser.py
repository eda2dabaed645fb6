"""Headless Chromium for the playground and Inside tests (server and inspect): a page on a live server,
skipped where the browser is absent (failed in CI), and the character vocabulary those servers use."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

#: the characters of the live servers' tokenizers
TEXT = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ:\n.,;!?'"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@contextlib.contextmanager
def chromium_page(base: str):
    """A headless Chromium page; yields ``(page, expect, external requests)``."""
    if not Path(CHROMIUM).exists():
        reason = f"{CHROMIUM} is absent (apt-get install chromium)"
        if os.environ.get("CI") or os.environ.get("GPTLAB_REQUIRE_SHARED") == "1":
            pytest.fail(f"the browser test must run in CI, but {reason}")
        pytest.skip(reason)
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 860})
            external: list[str] = []
            page.on("request", lambda req: req.url.startswith(base) or external.append(req.url))
            page.goto(base + "/")
            yield page, sync_api.expect, external
        finally:
            browser.close()
