"""``gptlab serve CKPT``: the OpenAI-compatible HTTP API and the web playground (FastAPI + uvicorn)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import socket
import sys
from pathlib import Path
from typing import Any

from gptlab.cli.options import add_device_argument, resolve_device, resolve_dtype

DTYPES = ("auto", "fp32", "bf16", "int8")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "serve",
        help="serve a checkpoint over an OpenAI-compatible HTTP API, with a web playground",
        description="Serve CKPT over HTTP: POST /v1/completions, /v1/chat/completions (OpenAI's wire format, "
        "streaming with SSE), GET /v1/models, /health, and the playground at /.",
    )
    p.add_argument(
        "checkpoint",
        metavar="CKPT",
        help="a checkpoint directory, or a run directory (its latest checkpoint)",
    )
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
        help="the largest max_tokens a request may ask for (default: the context length)",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("GPTLAB_API_KEY"),
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on /v1 routes (default: $GPTLAB_API_KEY, else none)",
    )
    p.add_argument(
        "--model-name", default=None, help="the model id clients use (default: the checkpoint's folder name)"
    )
    p.add_argument(
        "--dtype", choices=DTYPES, default="auto", help="weights (default auto: bf16 where native, else fp32)"
    )
    add_device_argument(p)
    p.add_argument(
        "--max-body-bytes",
        type=int,
        default=1 << 20,
        metavar="N",
        help="refuse request bodies larger than this (default 1 MiB)",
    )
    p.add_argument(
        "--log-level", default="warning", choices=("critical", "error", "warning", "info", "debug")
    )
    p.set_defaults(func=run)


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, port: int) -> None:
    """Fail early, with one line, if ``host:port`` cannot be listened on (in use, not this machine's)."""
    from gptlab.errors import GptlabError

    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise GptlabError(
            f"--host {host!r} is not an address this machine can resolve: {exc.strerror}"
        ) from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as exc:
            raise GptlabError(
                f"cannot listen on {host}:{port}: {exc.strerror or exc}; choose another --port or --host"
            ) from None


def load_for_serving(checkpoint: str, dtype: str, device: str = "cpu") -> tuple[Any, Any]:
    import gptlab
    from gptlab.errors import GptlabError

    model, tokenizer = gptlab.load(checkpoint, device=device)
    if tokenizer is None:
        raise GptlabError(
            f"{checkpoint}: the checkpoint has no tokenizer.json; serving needs one "
            "(save the model with its tokenizer: gptlab.save(model, tokenizer, dir))"
        )
    return gptlab.quantize(model, resolve_dtype(dtype, device)), tokenizer


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from gptlab.errors import GptlabError
    from gptlab.serve import create_app

    if not 0 <= args.port <= 65535:
        raise GptlabError(f"--port must be between 0 and 65535, got {args.port}")
    if args.max_batch < 1:
        raise GptlabError(f"--max-batch must be at least 1, got {args.max_batch}")
    if args.max_tokens_cap is not None and args.max_tokens_cap < 1:
        raise GptlabError(f"--max-tokens-cap must be at least 1, got {args.max_tokens_cap}")
    check_bind(args.host, args.port)
    device = resolve_device(args)
    model, tokenizer = load_for_serving(args.checkpoint, args.dtype, device)
    name = args.model_name or Path(args.checkpoint).resolve().name
    app = create_app(
        model,
        tokenizer,
        model_name=name,
        max_batch=args.max_batch,
        max_tokens_cap=args.max_tokens_cap,
        api_key=args.api_key or None,
        max_body_bytes=args.max_body_bytes,
    )
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
