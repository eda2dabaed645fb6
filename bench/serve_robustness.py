"""Can one request harm another? Issue #33's four scenarios against a live ``gptlab serve``.

    bad numbers   7 kinds of numbers that once broke the shared loop, each sent beside 3
                  concurrent requests: each must get a 4xx and every victim a 200
    hang-ups      streaming chats with n=16 that hang up after the first chunk: nothing may
                  stay active or waiting afterwards
    beam hang-up  a beam_width 16, n 16 request whose client leaves; the next beam request
    fairness      a one-token request beside a 64-choice × 1,024-token request: its latency

Run on a tiny random character model (saved to a temporary folder), with an API key:

    python bench/serve_robustness.py [--hangups 30] [--checkpoint DIR]

prints one JSON line; the tests (tests/serve/test_serve_isolation.py, tests/serve/test_serve_fairness.py)
run the same scenarios with fewer repetitions.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the checkout: bench/ imports as the package `bench`
from bench import serve_load  # noqa: E402

KEY = "bench-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TEXT = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ:\n.,;!?'"

#: (name, completions body) — each once made the shared loop or its own request fail with a 500
BAD_NUMBERS = [
    ("top_p 1.0000001", {"prompt": "J", "top_p": 1.0000001}),  # (1e-300 is valid: the top token alone)
    ("temperature 1e-320", {"prompt": "J", "temperature": 1e-320}),
    ("repetition_penalty 1e-40", {"prompt": "J", "repetition_penalty": 1e-40}),
    ("seed 2^64", {"prompt": "J", "seed": 2**64}),
    ("seed -2^63-1", {"prompt": "J", "seed": -(2**63) - 1}),
    ("length_penalty -487.6", {"prompt": "J", "beam_width": 2, "length_penalty": -487.6}),
    ("length_penalty 1e5", {"prompt": "J", "beam_width": 2, "length_penalty": 1e5}),
]


def tiny_checkpoint(folder: Path) -> Path:
    """A tiny random GPT with a character tokenizer (RoPE: it can run past its context)."""
    import torch

    import gptlab
    from gptlab import GPT, GPTConfig
    from gptlab.tokenizers import CharTokenizer

    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=tok.vocab_size, block_size=128, n_layer=2, n_head=4, n_embd=64, pos="rope")
    return gptlab.save(GPT(config), tok, folder / "tiny")


async def health(c: httpx.AsyncClient, url: str) -> dict[str, Any]:
    return (await c.get(f"{url}/health")).json()


async def settled(c: httpx.AsyncClient, url: str, timeout: float = 20.0) -> dict[str, Any]:
    """``/health`` once nothing is active or waiting (or at ``timeout``)."""
    deadline = time.monotonic() + timeout
    while (h := await health(c, url))["active"] + h["waiting"] and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    return h


async def bad_numbers(url: str, victims: int = 3) -> list[dict[str, Any]]:
    """Each bad body beside ``victims`` ordinary requests → its status and the victims' statuses."""
    victim = {"prompt": "ROMEO:", "max_tokens": 32, "temperature": 0.8, "seed": 1}
    out = []
    async with httpx.AsyncClient(timeout=60, headers=AUTH) as c:
        for name, body in BAD_NUMBERS:
            sends = [c.post(f"{url}/v1/completions", json={**body, "max_tokens": 8})]
            sends += [c.post(f"{url}/v1/completions", json=victim) for _ in range(victims)]
            bad, *rest = await asyncio.gather(*sends)
            out.append({"name": name, "status": bad.status_code, "victims": [r.status_code for r in rest]})
    return out


async def hangup(c: httpx.AsyncClient, url: str, path: str, body: dict[str, Any]) -> None:
    """Send a streaming request, read its first chunk, and hang up."""
    async with c.stream("POST", f"{url}{path}", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                break


async def hangups(url: str, count: int = 30) -> dict[str, Any]:
    """``count`` streaming n=16 chats that hang up after the first chunk → what is left afterwards."""
    body = {"messages": [{"role": "user", "content": "hi"}], "n": 16, "max_tokens": 1000, "stream": True}
    async with httpx.AsyncClient(timeout=60, headers=AUTH) as c:
        for _ in range(count):
            await hangup(c, url, "/v1/chat/completions", body)
        h = await settled(c, url)
        t0 = time.monotonic()
        after = await c.post(f"{url}/v1/completions", json={"prompt": "a", "max_tokens": 4})
        return {
            "count": count,
            "active": h["active"],
            "waiting": h["waiting"],
            "next_status": after.status_code,
            "next_s": round(time.monotonic() - t0, 3),
        }


async def abandon(c: httpx.AsyncClient, url: str, body: dict[str, Any]) -> None:
    """Send ``body`` to completions and give up once its jobs run (a client that leaves before any output)."""
    task = asyncio.create_task(c.post(f"{url}/v1/completions", json=body))
    deadline = time.monotonic() + 10
    while (await health(c, url))["active"] == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def beam_hangup(url: str) -> dict[str, Any]:
    """A beam_width 16 × n 16 request whose client leaves (non-streaming, then streaming) before its
    first token; then how long the next beam request takes."""
    big = {"prompt": "ROMEO:", "n": 16, "beam_width": 16, "max_tokens": 1000}
    async with httpx.AsyncClient(timeout=60, headers=AUTH) as c:
        cleared = []
        for stream in (False, True):
            await abandon(c, url, {**big, "stream": stream})
            t0 = time.monotonic()
            h = await settled(c, url)
            cleared.append(round(time.monotonic() - t0, 3))
        t0 = time.monotonic()
        nxt = await c.post(f"{url}/v1/completions", json={"prompt": "a", "beam_width": 2, "max_tokens": 8})
        return {
            "active": h["active"],
            "waiting": h["waiting"],
            "cleared_s": max(cleared),
            "next_status": nxt.status_code,
            "next_s": round(time.monotonic() - t0, 3),
        }


async def admitted(
    c: httpx.AsyncClient, url: str, jobs: int, cap: int, timeout: float = 20.0
) -> dict[str, Any]:
    """``/health`` once all ``jobs`` of one request are known and ``cap`` of them run (or at ``timeout``).

    The server admits a request's jobs over its first steps, so the first streamed chunk can come
    while only some of them run; a cap that is not kept shows as more than ``cap`` active.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        h = await health(c, url)
        if h["active"] + h["waiting"] >= jobs and h["active"] >= min(cap, jobs):
            return h
        await asyncio.sleep(0.02)
    return await health(c, url)


async def fairness(url: str, tokens: int = 1024, max_batch: int = 8) -> dict[str, Any]:
    """A one-token request beside a 4-prompt × n 16 × ``tokens``-token request → its latency."""
    from gptlab.serve.admission import per_request_cap

    big = {"prompt": ["ROMEO:", "JULIET:", "a", "b"], "n": 16, "max_tokens": tokens, "stream": True}
    async with httpx.AsyncClient(timeout=120, headers=AUTH) as c:
        async with c.stream("POST", f"{url}/v1/completions", json=big) as r:
            lines = r.aiter_lines()
            await anext(lines)  # the big request runs
            busy = await admitted(c, url, jobs=4 * 16, cap=per_request_cap(max_batch))
            t0 = time.monotonic()
            small = await c.post(f"{url}/v1/completions", json={"prompt": "a", "max_tokens": 1})
            latency = time.monotonic() - t0
        h = await settled(c, url)
    return {
        "small_status": small.status_code,
        "small_s": round(latency, 3),
        "big_active": busy["active"],
        "big_waiting": busy["waiting"],
        "left_active": h["active"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", help="a checkpoint to serve (default: a tiny random char model)")
    parser.add_argument("--hangups", type=int, default=30)
    parser.add_argument("--max-batch", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.checkpoint or str(tiny_checkpoint(Path(tmp)))
        extra = ["--api-key", KEY, "--device", "cpu"]
        with serve_load.serve(ckpt, max_batch=args.max_batch, extra=extra, timeout=120) as url:
            result = {
                "bad_numbers": asyncio.run(bad_numbers(url)),
                "hangups": asyncio.run(hangups(url, args.hangups)),
                "beam_hangup": asyncio.run(beam_hangup(url)),
                "fairness": asyncio.run(fairness(url, max_batch=args.max_batch)),
                "max_batch": args.max_batch,
            }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
