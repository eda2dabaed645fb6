"""Screenshot of the web playground for the README (loopback only).

    python tools/playground_screenshot.py CKPT docs/img/playground.png [--prompt TEXT] [--chat]

Starts ``gptlab serve CKPT`` on a free loopback port, drives Debian's headless Chromium with
Playwright (no browser download), generates, hovers a token to show its top-5 tooltip, and
saves the page; ``--chat`` sends the Chat tab's default message instead.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the checkout: bench/ imports as the package `bench`

from playwright.sync_api import expect, sync_playwright  # noqa: E402

from bench import serve_load  # noqa: E402  (the server fixture of the load benchmark)

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("checkpoint")
    p.add_argument("out")
    p.add_argument("--prompt", default="ROMEO:\nI ")
    p.add_argument("--chromium", default="/usr/bin/chromium")
    p.add_argument("--chat", action="store_true", help="show the Chat tab after one exchange")
    args = p.parse_args()
    with serve_load.serve(args.checkpoint, 8, ["--model-name", "demo"]) as url, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=args.chromium, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 820}, device_scale_factor=1)
        page.goto(url + "/")
        page.fill("#max_tokens", "110")
        page.fill("#seed", "11")
        page.fill("#temperature", "0.8")
        if args.chat:
            page.click("#tab-chat")
            page.click("#send")
        else:
            page.fill("#prompt", args.prompt)
            page.click("#generate")
        expect(page.locator("#status")).to_contain_text("tokens/s", timeout=60000)
        expect(page.locator("#query-label")).to_contain_text("heads", timeout=20000)
        page.wait_for_timeout(300)
        tokens = page.locator("#output .tok")
        tokens.nth(min(20, tokens.count() - 1)).hover()
        page.wait_for_timeout(200)
        page.screenshot(path=args.out)
        browser.close()
    print(args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
