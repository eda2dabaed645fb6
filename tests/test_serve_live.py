"""``gptlab serve`` as a real process on a loopback port: the official openai client,
50 concurrent streams from this process, a client that disconnects, and headless Chromium."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import shutil
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

import gptlab
from gptlab import GPT, GPTConfig
from gptlab.tokenizers import CharTokenizer

ROOT = Path(__file__).resolve().parents[1]
CAP = 20_000
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _load_bench():
    spec = importlib.util.spec_from_file_location("serve_load", ROOT / "bench" / "serve_load.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["serve_load"] = module
    spec.loader.exec_module(module)
    return module


serve_load = _load_bench()


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny random GPT with a character tokenizer, saved with ``gptlab.save``."""
    text = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ:\n.,;!?'"
    tok = CharTokenizer.from_text(text)
    torch.manual_seed(0)
    # RoPE: generation can run past the context (the window slides), so a long request stays busy
    model = GPT(
        GPTConfig(vocab_size=tok.vocab_size, block_size=128, n_layer=2, n_head=4, n_embd=64, pos="rope")
    )
    return gptlab.save(model, tok, tmp_path_factory.mktemp("serve") / "tiny")


@pytest.fixture(scope="module")
def server(checkpoint: Path):
    """``python -m gptlab serve CKPT`` on a free 127.0.0.1 port; yields its base URL."""
    env_threads = os.environ.get("OMP_NUM_THREADS")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    try:
        with serve_load.serve(
            str(checkpoint),
            max_batch=16,
            extra=["--model-name", "tiny", "--max-tokens-cap", str(CAP)],
            timeout=60,
        ) as url:
            yield url
    finally:
        if env_threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)


def test_openai_client(server):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=30, max_retries=0)
    assert [m.id for m in client.models.list().data] == ["tiny"]

    done = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=8, temperature=0)
    assert done.object == "text_completion" and len(done.choices) == 1
    assert done.usage.completion_tokens == 8 and done.usage.prompt_tokens == 6
    assert done.choices[0].finish_reason == "length"

    chunks = list(
        client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=8, temperature=0, stream=True)
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == done.choices[0].text
    assert chunks[-1].choices[0].finish_reason == "length"

    chat = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=6, temperature=0
    )
    assert chat.choices[0].message.role == "assistant" and isinstance(chat.choices[0].message.content, str)
    assert chat.usage.prompt_tokens == len("user: hi\nassistant:")
    streamed = list(
        client.chat.completions.create(
            model="tiny",
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=6,
            temperature=0,
            stream=True,
        )
    )
    assert "".join(c.choices[0].delta.content or "" for c in streamed) == chat.choices[0].message.content

    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-4", prompt="x", max_tokens=2)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model="tiny", prompt="x", max_tokens=CAP + 1)
    assert "max_tokens" in str(info.value)


def test_fifty_concurrent_streams(server):
    body = {
        "model": "tiny",
        "prompt": "ROMEO:\n",
        "max_tokens": 24,
        "temperature": 1.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    result = asyncio.run(serve_load.run_load(server, 50, body, timeout=60))
    assert result["failures"] == [] and result["ok"] == 50
    assert result["tokens"] == 50 * 24  # no end-of-text token: every stream runs to max_tokens


def test_disconnect_frees_the_slot(server):
    """A client that leaves mid-stream stops its generation long before max_tokens."""
    body = {"model": "tiny", "prompt": "a", "max_tokens": CAP, "stream": True}
    with httpx.Client(timeout=30) as c:
        before = c.get(f"{server}/health").json()["tokens"]
        with c.stream("POST", f"{server}/v1/completions", json=body) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")
            assert c.get(f"{server}/health").json()["active"] == 1
        deadline = time.monotonic() + 20
        while (h := c.get(f"{server}/health").json())["active"] and time.monotonic() < deadline:
            time.sleep(0.02)
    assert h["active"] == 0
    assert h["tokens"] - before < CAP  # cancelled, not run to the end


def test_playground_in_headless_chromium(server, tmp_path):
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
            external = []
            page.on("request", lambda req: req.url.startswith(server) or external.append(req.url))
            page.goto(server + "/")
            sync_api.expect(page.locator("#model")).to_contain_text("tiny")
            page.fill("#prompt", "ROMEO:\n")
            page.fill("#max_tokens", "40")
            page.fill("#seed", "7")
            page.click("#generate")
            tokens = page.locator("#output .tok")
            sync_api.expect(tokens.first).to_be_visible(timeout=20_000)
            sync_api.expect(page.locator("#status")).to_contain_text("tokens/s", timeout=20_000)
            n = tokens.count()
            assert 1 <= n <= 40
            assert all(
                0.0 <= float(p) <= 1.0 for p in tokens.evaluate_all("els => els.map(e => e.dataset.prob)")
            )
            assert page.locator("#output").inner_text().startswith("ROMEO:")
            tokens.first.hover()
            sync_api.expect(page.locator("#tooltip")).to_be_visible()
            assert page.locator("#tooltip").inner_text().count("%") == 5  # the top-5 alternatives
            sync_api.expect(page.locator("#query-label")).to_contain_text("heads", timeout=10_000)
            assert page.locator("#attn").evaluate("c => c.width") > 100
            shot = tmp_path / "playground.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            if os.environ.get("GPTLAB_SCREENSHOT"):  # refresh the README screenshot on request
                shutil.copy(shot, os.environ["GPTLAB_SCREENSHOT"])
            assert external == []  # no CDN, nothing outside the server
        finally:
            browser.close()


def test_health_reports_no_leaked_slots(server):
    """After every other test here, nothing is left running."""
    with httpx.Client(timeout=10) as c:
        deadline = time.monotonic() + 10
        while (h := c.get(f"{server}/health").json())["active"] and time.monotonic() < deadline:
            time.sleep(0.05)
    assert h["active"] == 0 and h["waiting"] == 0
    assert json.dumps(h)
