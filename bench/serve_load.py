"""Load test of ``gptlab serve``: N concurrent streaming completions vs one request alone.

    python bench/serve_load.py --checkpoint CKPT [--concurrency 50] [--max-tokens 64]   # starts a server
    python bench/serve_load.py --url http://127.0.0.1:8000 [--concurrency 50]            # uses a running one

Every stream is checked to be well-formed (OpenAI ``text_completion`` chunks, one
``finish_reason`` per choice, a usage chunk, then ``data: [DONE]`` and nothing after).
Prints one JSON line; the exit status is 1 if any request failed or was malformed.
Traffic stays on the given URL (loopback when the script starts the server).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import socket
import statistics
import subprocess
import sys
import time
from contextlib import contextmanager
from typing import Any
from urllib.request import urlopen

import httpx


class Malformed(Exception):
    """A stream that breaks the OpenAI wire format."""


def check_stream(events: list[str]) -> tuple[str, dict[str, int]]:
    """Validate the ``data:`` payloads of one streamed completion → ``(text, usage)``."""
    if not events or events[-1] != "[DONE]":
        raise Malformed(f"the stream does not end with [DONE] (last event: {events[-1:]!r})")
    text, finish, usage = [], None, None
    for raw in events[:-1]:
        if raw == "[DONE]":
            raise Malformed("[DONE] before the end of the stream")
        chunk = json.loads(raw)
        if "error" in chunk:
            raise Malformed(f"error event: {chunk['error']}")
        for key in ("id", "object", "created", "model", "choices"):
            if key not in chunk:
                raise Malformed(f"chunk without {key!r}: {raw}")
        if chunk["object"] != "text_completion":
            raise Malformed(f"object is {chunk['object']!r}, not 'text_completion'")
        if not chunk["choices"]:
            if "usage" not in chunk or usage is not None:
                raise Malformed(f"a chunk without choices must be the one usage chunk: {raw}")
            usage = chunk["usage"]
            continue
        for choice in chunk["choices"]:
            if set(choice) < {"text", "index", "logprobs", "finish_reason"} or choice["index"] != 0:
                raise Malformed(f"bad choice: {choice}")
            if finish is not None:
                raise Malformed("text after the finish_reason")
            text.append(choice["text"])
            finish = choice["finish_reason"]
    if finish not in ("stop", "length"):
        raise Malformed(f"finish_reason is {finish!r}")
    if usage is None or usage["total_tokens"] != usage["prompt_tokens"] + usage["completion_tokens"]:
        raise Malformed(f"bad usage: {usage}")
    return "".join(text), usage


async def one_stream(client: httpx.AsyncClient, url: str, body: dict[str, Any]) -> dict[str, Any]:
    """Send one streaming completion; time to first token, latency and the checked result."""
    t0 = time.perf_counter()
    ttft = None
    events: list[str] = []
    async with client.stream("POST", f"{url}/v1/completions", json=body) as r:
        if r.status_code != 200:
            raise Malformed(f"status {r.status_code}: {(await r.aread())[:200]!r}")
        if not r.headers.get("content-type", "").startswith("text/event-stream"):
            raise Malformed(f"content-type {r.headers.get('content-type')!r}")
        async for line in r.aiter_lines():
            if not line:
                continue
            if not line.startswith("data: "):
                raise Malformed(f"not an SSE data line: {line!r}")
            if ttft is None:
                ttft = time.perf_counter() - t0
            events.append(line[6:])
    text, usage = check_stream(events)
    return {
        "ttft": ttft,
        "latency": time.perf_counter() - t0,
        "tokens": usage["completion_tokens"],
        "text": text,
    }


async def run_load(
    url: str, concurrency: int, body: dict[str, Any], timeout: float, headers: dict[str, str] | None = None
) -> dict[str, Any]:
    """``concurrency`` simultaneous streams → aggregate tokens/s and per-request figures."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=headers) as client:
        t0 = time.perf_counter()
        results = await asyncio.wait_for(
            asyncio.gather(
                *(one_stream(client, url, {**body, "seed": i}) for i in range(concurrency)),
                return_exceptions=True,
            ),
            timeout,
        )
        wall = time.perf_counter() - t0
    ok = [r for r in results if isinstance(r, dict)]
    failures = [f"{type(r).__name__}: {r}" for r in results if not isinstance(r, dict)]
    tokens = sum(r["tokens"] for r in ok)
    return {
        "ok": len(ok),
        "failures": failures,
        "tokens": tokens,
        "wall_s": wall,
        "tokens_per_s": tokens / wall if wall > 0 else 0.0,
        "ttft_ms_p50": 1000 * statistics.median([r["ttft"] for r in ok]) if ok else None,
        "latency_s_p95": _pct([r["latency"] for r in ok], 0.95),
    }


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, round(q * (len(values) - 1)))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(url: str, proc: subprocess.Popen | None, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the server exited with status {proc.returncode}")
        try:
            with urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{url} did not become healthy within {timeout:.0f}s")


@contextmanager
def serve(checkpoint: str, max_batch: int, extra: list[str] | None = None, timeout: float = 60):
    """Start ``gptlab serve CHECKPOINT`` on a free loopback port; yields its URL."""
    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "gptlab",
        "serve",
        checkpoint,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--max-batch",
        str(max_batch),
        *(extra or []),
    ]
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    url = f"http://127.0.0.1:{port}"
    try:
        try:
            wait_healthy(url, proc, timeout)
        except RuntimeError:
            proc.kill()
            raise RuntimeError(f"gptlab serve did not start: {proc.communicate()[1][-2000:]}") from None
        yield url
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    body = {
        "prompt": args.prompt,
        "max_tokens": args.max_tokens,
        "temperature": args.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if args.model:
        body["model"] = args.model
    asyncio.run(run_load(url, 1, body, args.timeout, headers))  # warm-up
    singles = [asyncio.run(run_load(url, 1, body, args.timeout, headers)) for _ in range(args.single_runs)]
    load = asyncio.run(run_load(url, args.concurrency, body, args.timeout, headers))
    single = statistics.median(s["tokens_per_s"] for s in singles)
    return {
        "bench": "serve_load",
        "concurrency": args.concurrency,
        "max_tokens": args.max_tokens,
        "requests_ok": load["ok"],
        "failures": load["failures"][:5],
        "completion_tokens": load["tokens"],
        "wall_s": round(load["wall_s"], 3),
        "aggregate_tokens_per_s": round(load["tokens_per_s"], 1),
        "single_tokens_per_s": round(single, 1),
        "speedup": round(load["tokens_per_s"] / single, 2) if single else None,
        "ttft_ms_p50": None if load["ttft_ms_p50"] is None else round(load["ttft_ms_p50"], 1),
        "latency_s_p95": None if load["latency_s_p95"] is None else round(load["latency_s_p95"], 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--url", help="a running server, e.g. http://127.0.0.1:8000")
    src.add_argument("--checkpoint", help="start `gptlab serve CHECKPOINT` on a free loopback port")
    p.add_argument("--concurrency", type=int, default=50)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--max-batch", type=int, default=16, help="--max-batch of the server this script starts")
    p.add_argument("--prompt", default="ROMEO:\n")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--model", default=None, help="the model name to send (default: none, the server's model)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--single-runs", type=int, default=3, help="single-request runs (the median is reported)")
    p.add_argument("--timeout", type=float, default=120.0)
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads of the server started (OMP_NUM_THREADS)"
    )
    p.add_argument(
        "--serve-args", default="", help="more flags for the server this script starts, e.g. '--compile on'"
    )
    p.add_argument(
        "--warmup",
        action="store_true",
        help="one untimed load at full concurrency first (a compiled server compiles at its first steps)",
    )
    args = p.parse_args(argv)
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    if args.url:
        result = measure(args.url.rstrip("/"), args)
    else:
        with serve(
            args.checkpoint, args.max_batch, shlex.split(args.serve_args), timeout=args.timeout
        ) as url:
            if args.warmup:
                body = {"prompt": args.prompt, "max_tokens": args.max_tokens, "stream": True}
                asyncio.run(run_load(url, args.concurrency, {**body, "temperature": args.temperature}, 600.0))
            result = measure(url, args)
    result["serve_args"] = args.serve_args
    print(json.dumps(result))
    return 0 if result["requests_ok"] == args.concurrency and not result["failures"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
