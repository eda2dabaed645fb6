"""Starting a server: can this address be listened on, is it this machine only, and the model to serve."""

from __future__ import annotations

import ipaddress
import socket
from pathlib import Path
from typing import Any

from gptlab.errors import GptlabError


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


def model_name(source: str) -> str:
    """The model id clients use by default: a folder's name, a GGUF file's name without ``.gguf``, a
    packaged short name (``smollm2``) as it is typed."""
    path = Path(source)
    if not path.exists():
        return path.name
    path = path.resolve()
    return path.stem if path.is_file() and path.suffix.lower() == ".gguf" else path.name


def load_for_serving(
    checkpoint: str, dtype: str, device: str = "cpu", store: str | None = None
) -> tuple[Any, Any]:
    """The model ``checkpoint`` names (any source ``gptlab.sources`` opens; weights in ``dtype``, on
    ``device``; a GGUF file's conversion kept in ``store``) and its tokenizer, which serving needs."""
    from gptlab.model.weight_formats import quantize
    from gptlab.sources import load

    model, tokenizer = load(checkpoint, device=device, quantize=dtype, store=store)  # converted while read
    if tokenizer is None:
        raise GptlabError(
            f"{checkpoint}: the model has no tokenizer (tokenizer.json); serving needs one "
            "(save the model with its tokenizer: gptlab.save(model, tokenizer, dir))"
        )
    return (model if dtype == "keep" else quantize(model, dtype)), tokenizer  # keep: a GGUF file's own
