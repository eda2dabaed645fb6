"""What the server tests share: the served tiny model (two heads, a given vocabulary), the ``data:``
payloads of a server-sent-events response, the checks of the one error shape, and the raw
log-probabilities of a plain forward pass."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gptlab import GPT
from tests import _tiny

#: the end-of-text token of the echo tests' tokenizer (the ``tok`` fixture of tests/serve/conftest.py)
EOT = "<|endoftext|>"


def tiny_model(vocab_size: int, block_size: int = 64, seed: int = 0) -> GPT:
    """The served model: the shared tiny model (tests/_tiny.py) with two heads."""
    return _tiny.tiny_model(seed=seed, vocab_size=vocab_size, block_size=block_size, n_head=2)


def sse_events(response) -> list[str]:
    """The ``data:`` payloads of an SSE response; every non-blank line must be one."""
    out = []
    for line in response.iter_lines():
        if line:
            assert line.startswith("data: "), line
            out.append(line[6:])
    return out


def assert_error(r, status: int, param: str | None = None) -> dict:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"}
    assert isinstance(err["message"], str) and err["message"]
    if param is not None:
        assert err["param"] == param
    return err


def raw_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log softmax of the plain forward pass over ``ids``: (T, V)."""
    with torch.no_grad():
        return F.log_softmax(model(torch.tensor([ids]))[0].float(), dim=-1)
