"""OpenAI's two ``logprobs`` shapes, built from the ``TokenEvent``\\ s of one choice.

    log p(y_t) = log softmax(l)_y     l: the model's raw logits at that step, whatever the sampling
                                      settings (temperature, penalties, logit_bias, top-k/top-p/min-p
                                      only choose y) — OpenAI's meaning, vLLM's default
                                      (``raw_logprobs``), and the probability the playground shades

Completions (``logprobs: N``) report every sampled token, the stop token that ended the choice included
(its text is never shown; ``usage.completion_tokens`` counts it); with ``echo`` the prompt's tokens come
first, scored by the model's raw distribution, the first with ``null`` (``serve/echo.py``)::

    {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{text: logprob}, ...], "text_offset": [...]}

Chat (``logprobs: true, top_logprobs: N``)::

    {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal": null}

A log-probability of −∞ (a logit of −∞ from the model) is reported as −9999.0 (JSON has no −∞).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gptlab.generate.request import TokenEvent, token_text

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

FLOOR = -9999.0


def _finite(logprob: float) -> float:
    return logprob if math.isfinite(logprob) else FLOOR


def completion_logprobs(
    tokenizer: Tokenizer, events: Sequence[TokenEvent], offset: int = 0
) -> dict[str, list]:
    """The completions shape for ``events`` (tokens only); ``offset``: where their text starts."""
    out: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for e in events:
        if e.token_id is None or e.logprob is None:
            continue
        text = token_text(tokenizer, e.token_id)
        out["tokens"].append(text)
        out["token_logprobs"].append(_finite(e.logprob))
        out["top_logprobs"].append({alt.text: _finite(alt.logprob) for alt in e.top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def _chat_token(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    raw = tokenizer.token_bytes(token_id)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": _finite(logprob), "bytes": list(raw)}


def chat_logprobs(tokenizer: Tokenizer, events: Sequence[TokenEvent]) -> dict[str, Any]:
    """The chat shape for ``events`` (tokens only)."""
    content = []
    for e in events:
        if e.token_id is None or e.logprob is None or e.stop:  # chat never reports the end-of-turn token
            continue
        item = _chat_token(tokenizer, e.token_id, e.logprob)
        item["top_logprobs"] = [_chat_token(tokenizer, alt.token_id, alt.logprob) for alt in e.top]
        content.append(item)
    return {"content": content, "refusal": None}
