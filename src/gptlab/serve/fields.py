"""Request fields checked against the served model before a ``SampleConfig`` is built.

``logit_bias``: OpenAI's ``{"token id": bias}`` → ``{id: bias}``, every id in the vocabulary.

``response_format`` → the JSON schema the reply must follow (structured output):

    text         → None (free text)
    json_object  → {"type": "object"}                       any JSON object
    json_schema  → json_schema.schema (no schema: any JSON object; ``strict`` either way: enforced)

The schema is compiled for the served tokenizer when the request arrives (``check_constraint``: the
grammar engine caches it, so the request's own steps reuse the compiled form), so that one it cannot
take is a 400 in OpenAI's shape naming the part, before anything is queued and without touching the
scheduler. The mask itself is applied in each job's ``RequestState`` (``gptlab.generate.grammar``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gptlab.errors import GptlabError
from gptlab.generate import SampleConfig
from gptlab.generate.grammar import check_constraint
from gptlab.generate.request import vocab_size
from gptlab.serve.errors import APIError
from gptlab.serve.schemas import SamplingFields

if TYPE_CHECKING:
    from gptlab.generate.request import TokenEvent
    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer


def logit_bias(req: SamplingFields, tokenizer: Tokenizer) -> dict[int, float]:
    """OpenAI's ``{"token id": bias}`` → ``{id: bias}``, each id in the vocabulary, each bias in [-100, 100]."""
    out = {}
    for key, bias in (req.logit_bias or {}).items():
        if not (key.isascii() and key.isdigit()) or int(key) >= tokenizer.vocab_size:
            raise APIError(
                400,
                f"logit_bias: {key!r} is not a token id of this model (0..{tokenizer.vocab_size - 1})",
                param="logit_bias",
            )
        if not -100 <= bias <= 100:
            raise APIError(400, f"logit_bias: {bias} is outside [-100, 100]", param="logit_bias")
        out[int(key)] = bias
    return out


def response_schema(
    req: SamplingFields, tokenizer: Tokenizer, model: GPT, json_output: bool
) -> dict[str, Any] | None:
    """The schema ``req.response_format`` asks for, checked for this model (``json_output``: its
    vocabulary can write JSON), or None for free text; an ``APIError`` (400) where it cannot be."""
    schema = req.json_schema()
    if schema is None:
        return None
    if not json_output:
        raise APIError(
            400,
            "response_format: this model's vocabulary cannot write JSON (it lacks braces, brackets, "
            "quotes or digits); use response_format text",
            param="response_format",
        )
    if req.beam_width > 1:
        raise APIError(
            400,
            "response_format: beam search (beam_width > 1) does not take a JSON schema; use beam_width 1",
            param="response_format",
        )
    try:
        check_constraint(SampleConfig(json_schema=schema), tokenizer, vocab_size(model, tokenizer))
    except GptlabError as exc:
        raise APIError(400, f"response_format: {exc}", param="response_format") from None
    return schema


def grammar_fields(event: TokenEvent) -> dict[str, Any]:
    """A playground token event's structured-output extras: how many tokens the grammar allowed at that
    step (``allowed``), and for each alternative whether it was one of them; nothing for free text."""
    if event.allowed is None:
        return {}
    return {"allowed": event.allowed, "top_allowed": event.top_allowed}
