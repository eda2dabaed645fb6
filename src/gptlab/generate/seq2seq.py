"""Encoder–decoder generation: encode the source once, then decode the target like a GPT.

    H_enc = Encoder(source);  K_enc, V_enc = H_enc·W_K, H_enc·W_V   per decoder layer, once
    y_0 = BOS;  y_t ~ choose(P(· | y_<t, source))                   until EOS (= <|endoftext|>)

``EncoderDecoder.bind(source)`` holds the cached cross-attention keys and values and
looks like a GPT to ``BatchSession``, so every strategy of ``gptlab.generate`` (greedy,
temperature, top-k/p, min-p, penalties, beam search) runs on it unchanged. The public entry
points (``stream_events``, ``generate_text``, ``generate_batch``) take an encoder–decoder as they
take a GPT: ``bind_source`` is what they call for one (``gptlab.generate.decode.PROMPTS``). A
bidirectional encoder (``arch="encoder"``) predicts masked tokens, not the next one, so it cannot
generate.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

from gptlab.errors import GptlabError
from gptlab.generate.beam import beam_search
from gptlab.generate.config import SampleConfig
from gptlab.generate.decoder import Decoder, logits_of
from gptlab.generate.loop import decode_events, decode_rows, start
from gptlab.generate.step import TokenEvent
from gptlab.model.encdec import EncoderDecoder

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer


def is_seq2seq(model: Decoder) -> bool:
    """True for an encoder–decoder model (it generates from a source)."""
    return getattr(model.config, "arch", "decoder") == "encoder-decoder"


def check_generative(model: Decoder, name: str = "this model") -> None:
    """Refuse a bidirectional encoder, which has no next-token distribution to sample from."""
    if not getattr(model.config, "causal", True):
        raise GptlabError(
            f"{name} is a bidirectional encoder (masked-language model): it predicts masked tokens, "
            f'not the next one, so it cannot generate; use `gptlab fill CKPT "text with [MASK]"`'
        )


def source_ids(tokenizer: Tokenizer, source: str) -> list[int]:
    """Token ids of a source text (it must not be empty)."""
    if not isinstance(source, str):
        raise GptlabError(f"a source must be a string, got {type(source).__name__}")
    ids = list(tokenizer.encode(source)) if source else []
    if not ids:
        raise GptlabError("an encoder-decoder model needs a source to translate; give a non-empty --prompt")
    return ids


def bos_ids(tokenizer: Tokenizer) -> list[int]:
    """The target's first token: ``<|endoftext|>``."""
    eot = getattr(tokenizer, "eot_id", None)
    if eot is None:
        raise GptlabError("the tokenizer has no <|endoftext|>, which begins and ends a target")
    return [int(eot)]


def bind_source(model: Decoder, tokenizer: Tokenizer, source: str) -> tuple[Decoder, list[int]]:
    """The decoder bound to ``source`` (encoded once) and the ids its target starts from."""
    if not isinstance(model, EncoderDecoder):
        raise GptlabError(f"only an encoder-decoder model binds a source, not a {type(model).__name__}")
    ids = source_ids(tokenizer, source)
    return model.bind(ids), bos_ids(tokenizer)


def stream_ids(
    model: EncoderDecoder,
    tokenizer: Tokenizer,
    source: Sequence[int],
    config: SampleConfig | None = None,
    *,
    cache_dtype: torch.dtype | None = None,
    want_probs: bool = False,
) -> Iterator[TokenEvent]:
    """The target's events for a source given as token ids (the server's jobs)."""
    config = config or SampleConfig()
    if not source:
        raise GptlabError("an encoder-decoder model needs a source to translate; give a non-empty prompt")
    yield from decode_events(
        model.bind(source), tokenizer, bos_ids(tokenizer), config, cache_dtype, want_probs
    )


def target_ids(
    model: EncoderDecoder,
    source: Sequence[int],
    bos_id: int,
    config: SampleConfig,
    cache_dtype: torch.dtype | None = None,
) -> tuple[list[int], str]:
    """Token ids of the target of ``source`` (ids) → ``(ids without BOS and the stop token, finish_reason)``.

    Stops at ``config.stop_tokens`` (give the EOS id there) or ``max_new_tokens``.
    """
    bound = model.bind(source)
    if config.beam_width > 1:
        return beam_search(bound, [bos_id], config, None, cache_dtype)
    session, rows = start(bound, None, [[bos_id]], config, cache_dtype)
    tokens = [e.token_id for e in decode_rows(session, rows) if e.token_id is not None]
    return tokens, rows[0].step.reason or "length"


@torch.no_grad()
def greedy_uncached(
    model: EncoderDecoder, source: Sequence[int], bos_id: int, steps: int
) -> list[torch.Tensor]:
    """Reference: the next-token logits of greedy decoding, re-running encoder and decoder each step."""
    src = torch.tensor([list(source)], device=model.device)
    ids, out = [bos_id], []
    for _ in range(steps):
        logits = logits_of(model.run(torch.tensor([ids], device=model.device), source=src))[0, -1].float()
        out.append(logits)
        ids.append(int(logits.argmax()))
    return out


__all__ = [
    "bind_source",
    "bos_ids",
    "check_generative",
    "greedy_uncached",
    "is_seq2seq",
    "source_ids",
    "stream_ids",
    "target_ids",
]
