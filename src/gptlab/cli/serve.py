"""``gptlab serve MODEL``: the OpenAI-compatible HTTP API and the web playground (FastAPI + uvicorn)."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gptlab.cli import startup
from gptlab.cli.background import Later
from gptlab.cli.options import (
    add_compile_argument,
    add_device_argument,
    add_model_argument,
    add_weights_argument,
    cache_dir,
    device_from_args,
    prepare_decode,
    print_plan,
    weights_format,
)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a model over an OpenAI-compatible HTTP API, with a web playground",
        description="Serve MODEL (a checkpoint, run, Hugging Face folder, GGUF file or smollm2) over HTTP: POST /v1/completions, /v1/chat/completions (OpenAI's wire format, "
        "streaming with SSE), GET /v1/models, /v1/gptlab/limits, /health, and the playground at /. "
        "A masked-language encoder is served with the playground's Inside view and POST /v1/gptlab/fill.",
    )
    add_model_argument(p)
    p.add_argument(
        "--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)"
    )
    p.add_argument("--port", type=int, default=8000, help="port (default 8000)")
    p.add_argument(
        "--max-batch",
        type=int,
        default=8,
        metavar="N",
        help="requests decoded together in one batched step (default 8)",
    )
    p.add_argument(
        "--max-tokens-cap",
        type=int,
        default=None,
        metavar="N",
        help="the largest max_tokens a request may ask for (default: 1024, or the context length if "
        "larger; past the context the window slides)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("GPTLAB_API_KEY"),
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1 routes (default: $GPTLAB_API_KEY, else none)",
    )
    p.add_argument(
        "--cors",
        action="append",
        metavar="ORIGIN",
        help="a web page origin (such as https://chat.example.org) whose scripts a browser lets call the "
        "API; repeat for more; '*' any page, 'none' no page (default: pages served from this machine, "
        "http(s)://localhost, 127.0.0.1 or [::1] on any port)",
    )
    p.add_argument(
        "--model-name",
        default=None,
        help="the model id clients use (default: the model's folder or file name)",
    )
    add_weights_argument(p)
    add_device_argument(p)
    add_compile_argument(p)
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=1 << 20,
        metavar="N",
        help="refuse request bodies larger than this (default 1 MiB)",
    )
    p.add_argument(
        "--prefix-cache-mb",
        type=float,
        default=256,
        metavar="N",
        help="MiB of keys and values of recent prompts (and finished replies) kept for the next request "
        "that starts with the same tokens, least recently used evicted first; 0 turns it off (default 256)",
    )
    p.add_argument(
        "--kv-keep-s",
        type=float,
        default=60,
        metavar="SECONDS",
        help="how long an idle server keeps the KV cache its requests grew (up to --max-batch rows of the "
        "longest request) before giving the memory back, so that the next request does not allocate it "
        "again; 0 gives it back at once (default 60)",
    )
    p.add_argument(
        "--log-level",
        default="warning",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn's log level (default warning); the server's own notes (such as taking up a one-row "
        "step that a background compile kept) are printed unless it is error or critical",
    )
    p.set_defaults(func=run, loads_a_model=True)  # the collector paused until then: cli/startup.py


def _show_notes(level: str) -> None:
    """The server's own log (``gptlab.serve``) on stderr, one line a note, from INFO up unless ``level``
    (``--log-level``) is higher."""
    import logging

    log = logging.getLogger("gptlab.serve")
    if not log.handlers:  # (a second server in the same process prints each note once)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(handler)
    asked = logging.getLevelName(level.upper())
    log.setLevel(asked if asked > logging.WARNING else min(asked, logging.INFO))


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from gptlab.errors import GptlabError
    from gptlab.serve import create_app
    from gptlab.serve.launch import check_bind, is_loopback, load_for_serving, model_name
    from gptlab.serve.tasks import task_of

    if not 0 <= args.port <= 65535:
        raise GptlabError(f"--port must be between 0 and 65535, got {args.port}")
    if args.max_batch < 1:
        raise GptlabError(f"--max-batch must be at least 1, got {args.max_batch}")
    if args.prefix_cache_mb < 0:
        raise GptlabError(f"--prefix-cache-mb must be 0 (off) or more, got {args.prefix_cache_mb}")
    if not args.kv_keep_s >= 0:
        raise GptlabError(f"--kv-keep-s must be 0 or more seconds, got {args.kv_keep_s}")
    if args.max_tokens_cap is not None and args.max_tokens_cap < 1:
        raise GptlabError(f"--max-tokens-cap must be at least 1, got {args.max_tokens_cap}")
    check_bind(args.host, args.port)
    device = device_from_args(args)
    store = cache_dir(args.weights_cache)
    weights = weights_format(args.dtype, device, args.checkpoint, args.max_batch, store)
    model, tokenizer = load_for_serving(args.checkpoint, weights, device, store)
    if task_of(model) == "generate":
        # a server: a long session; a request decoded alone loads the one-row step once it is kept
        later = Later(args.checkpoint, weights, store) if args.background_compile == "auto" else None
        engine = prepare_decode(
            args.compile, model, None, static=args.static, compile_cache=args.compile_cache, later=later
        )
        print_plan(engine, args.max_batch)
    else:
        sys.stderr.write(
            "a masked-language encoder does not generate: the playground shows Inside and fills [MASK]s "
            "(POST /v1/gptlab/fill); the generating routes answer 400\n"
        )
    name = args.model_name or model_name(args.checkpoint)
    app = create_app(
        model,
        tokenizer,
        model_name=name,
        max_batch=args.max_batch,
        max_tokens_cap=args.max_tokens_cap,
        api_key=args.api_key or None,
        max_body_bytes=args.max_body_bytes,
        prefix_cache_mb=args.prefix_cache_mb,
        kv_keep_s=args.kv_keep_s,
        cors_origins=None if args.cors is None else [o for o in args.cors if o != "none"],
    )
    _show_notes(args.log_level)
    startup.started()  # the collector runs again while serving (cli/startup.py)
    if not is_loopback(args.host) and not args.api_key:
        sys.stderr.write(
            f"warning: binding {args.host} without --api-key: anyone who can reach this port "
            "can use the model; pass --api-key KEY (or set GPTLAB_API_KEY)\n"
        )
    shown = f"[{args.host}]" if ":" in args.host else args.host
    sys.stderr.write(
        f"serving {name!r} ({model.quantization} on {device}, max batch {args.max_batch}) on http://{shown}:{args.port}/ "
        f"- playground at /, API at /v1\n"
    )
    sys.stderr.flush()
    try:
        uvicorn.run(
            app, host=args.host, port=args.port, log_level=args.log_level, timeout_graceful_shutdown=5
        )
    except OSError as exc:
        raise GptlabError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    return 0
