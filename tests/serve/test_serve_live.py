"""``gptlab serve`` as a real process on a loopback port: the official openai client,
50 concurrent streams from this process, a client that disconnects, and headless Chromium."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import time
from pathlib import Path

import httpx
import pytest

import gptlab
from bench import serve_load
from gptlab.tokenizers import CharTokenizer
from tests._browser import TEXT, chromium_page
from tests._tiny import tiny_model

CAP = 20_000


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """A tiny random GPT with a character tokenizer, saved with ``gptlab.save``."""
    tok = CharTokenizer.from_text(TEXT)
    # RoPE: generation can run past the context (the window slides), so a long request stays busy
    model = tiny_model(vocab_size=tok.vocab_size, block_size=128, n_embd=64, pos="rope")
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
            extra=[
                "--model-name",
                "tiny",
                "--max-tokens-cap",
                str(CAP),
                "--device",
                "cpu",
            ],  # CPU numerics and timing
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
    with chromium_page(server) as (page, expect, external):
        expect(page.locator("#model")).to_contain_text("tiny")
        page.fill("#prompt", "ROMEO:\n")
        page.fill("#max_tokens", "40")
        page.fill("#seed", "7")
        page.click("#generate")
        tokens = page.locator("#output .tok")
        expect(tokens.first).to_be_visible(timeout=20_000)
        expect(page.locator("#status")).to_contain_text("tokens/s", timeout=20_000)
        n = tokens.count()
        assert 1 <= n <= 40
        assert all(0.0 <= float(p) <= 1.0 for p in tokens.evaluate_all("els => els.map(e => e.dataset.prob)"))
        assert page.locator("#output").inner_text().startswith("ROMEO:")
        tokens.first.hover()
        expect(page.locator("#tooltip")).to_be_visible()
        assert page.locator("#tooltip").inner_text().count("%") == 5  # the top-5 alternatives
        expect(page.locator("#query-label")).to_contain_text("heads", timeout=10_000)
        assert page.locator("#attn").evaluate("c => c.width") > 100
        shot = tmp_path / "playground.png"
        page.screenshot(path=str(shot), full_page=True)
        assert shot.stat().st_size > 10_000
        if os.environ.get("GPTLAB_SCREENSHOT"):  # refresh the README screenshot on request
            shutil.copy(shot, os.environ["GPTLAB_SCREENSHOT"])
        assert external == []  # no CDN, nothing outside the server


@pytest.fixture(scope="module")
def default_checkpoint(tmp_path_factory) -> Path:
    """The shape of the old default preset: learned positions and a context of 64 tokens."""
    tok = CharTokenizer.from_text(TEXT)
    model = tiny_model(vocab_size=tok.vocab_size, block_size=64, n_head=2)
    return gptlab.save(model, tok, tmp_path_factory.mktemp("serve") / "default")


@pytest.mark.slow  # ≈ 25 s each on 2 busy cores: a server start, a browser, two generations
@pytest.mark.parametrize("extra", [[], ["--max-tokens-cap", "50"]], ids=["defaults", "cap-50"])
def test_playground_generate_and_chat_work_on_the_first_click(default_checkpoint, extra):
    """Every field left as the page sets it: Generate, then Chat, each shows text, never an error."""
    with serve_load.serve(str(default_checkpoint), max_batch=8, extra=extra, timeout=60) as url:
        limits = httpx.get(f"{url}/v1/gptlab/limits", timeout=10).json()
        assert limits["max_tokens"] == (50 if extra else 1024) and limits["context_length"] == 64
        with chromium_page(url) as (page, expect, external):
            expect(page.locator("#model")).to_contain_text("max tokens", timeout=60_000)
            field = page.locator("#max_tokens")
            assert field.get_attribute("max") == str(limits["max_tokens"])
            assert 1 <= int(field.input_value()) <= limits["max_tokens"]
            page.click("#generate")
            expect(page.locator("#status")).to_contain_text("tokens/s", timeout=180_000)
            assert page.locator("#output .tok").count() >= 1 and page.locator("#output .error").count() == 0
            page.click("#tab-chat")
            page.click("#send")
            expect(page.locator("#status")).to_contain_text("finish", timeout=180_000)
            reply = page.locator("#output .assistant .tok")
            assert reply.count() >= 1 and page.locator("#output .error").count() == 0
            assert all(
                0.0 < float(p) <= 1.0 for p in reply.evaluate_all("els => els.map(e => e.dataset.prob)")
            )
            assert external == []


def test_openai_client_logprobs_and_logit_bias(server):
    """The official client parses logprobs of completions and chat, streamed or not."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=30, max_retries=0)
    done = client.completions.create(model="tiny", prompt="ROMEO:", max_tokens=6, temperature=0, logprobs=3)
    lp = done.choices[0].logprobs
    assert "".join(lp.tokens) == done.choices[0].text and len(lp.token_logprobs) == 6
    assert all(
        len(top) == 3 and max(top.values()) == pytest.approx(v)
        for v, top in zip(lp.token_logprobs, lp.top_logprobs)
    )
    streamed = client.completions.create(
        model="tiny", prompt="ROMEO:", max_tokens=6, temperature=0, logprobs=3, stream=True
    )
    assert [
        v
        for c in streamed
        if c.choices and c.choices[0].logprobs
        for v in c.choices[0].logprobs.token_logprobs
    ] == pytest.approx(lp.token_logprobs)
    kw = dict(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=5, temperature=0)
    chat = client.chat.completions.create(**kw, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 5 and all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
    chunks = list(client.chat.completions.create(**kw, logprobs=True, top_logprobs=2, stream=True))
    assert [
        i.logprob
        for c in chunks
        if c.choices and c.choices[0].logprobs
        for i in c.choices[0].logprobs.content
    ] == pytest.approx([c.logprob for c in content])
    (z,) = CharTokenizer.from_text(TEXT).encode("z")
    forced = client.completions.create(model="tiny", prompt="a", max_tokens=4, logit_bias={str(z): 100})
    assert forced.choices[0].text == "z" * 4


def test_edge_cases_over_a_real_connection(server):
    """Deep nesting and 5,000 prompts are 400s in OpenAI's shape, not a 500 or a reset connection."""
    with httpx.Client(timeout=30) as c:
        headers = {"content-type": "application/json"}
        r = c.post(f"{server}/v1/completions", content=b"[" * 50_000 + b"]" * 50_000, headers=headers)
        assert r.status_code == 400 and set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = c.post(f"{server}/v1/completions", json={"prompt": ["ab"] * 5000, "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"


def test_health_reports_no_leaked_slots(server):
    """After every other test here, nothing is left running."""
    with httpx.Client(timeout=10) as c:
        deadline = time.monotonic() + 10
        while (h := c.get(f"{server}/health").json())["active"] and time.monotonic() < deadline:
            time.sleep(0.05)
    assert h["active"] == 0 and h["waiting"] == 0
    assert json.dumps(h)


@pytest.mark.slow  # a server start, a browser, a constrained call
def test_playground_shows_tool_calls(tmp_path):
    """Chat with a tool and tool choice "required": the reply shows the call, name(arguments)."""
    import string

    printable = "".join(c for c in string.printable if c not in "\t\r\x0b\x0c")
    tok = CharTokenizer.from_text(printable, special_tokens=["<|endoftext|>"])
    model = tiny_model(vocab_size=tok.vocab_size, block_size=2048, n_head=2, pos="rope")
    ckpt = gptlab.save(model, tok, tmp_path / "tools")
    tool = {
        "type": "function",
        "function": {
            "name": "paint",
            "parameters": {
                "type": "object",
                "properties": {"color": {"enum": ["red", "green"]}},
                "required": ["color"],
                "additionalProperties": False,
            },
        },
    }
    with serve_load.serve(str(ckpt), max_batch=2, extra=["--device", "cpu"], timeout=60) as url:
        with chromium_page(url) as (page, expect, external):
            page.click("#tab-chat")
            page.fill("#tools", json.dumps([tool]))
            page.select_option("#tool_choice", "required")
            page.fill("#max_tokens", "200")
            page.fill("#seed", "1")
            page.click("#send")
            expect(page.locator("#status")).to_contain_text("finish", timeout=120_000)
            calls = page.locator("#output .assistant .toolcall")
            expect(calls.first).to_be_visible(timeout=10_000)
            for text in calls.all_inner_texts():  # one call or more (parallel_tool_calls)
                assert text.startswith("tool call: paint(") and text.endswith(")")
                assert json.loads(text[len("tool call: paint(") : -1])["color"] in ("red", "green")
            assert page.locator("#output .error").count() == 0 and external == []
