"""The public entry points of generation, for decoder-only and encoder–decoder models alike.

    prompt → (the model to decode, the ids to start from) → start → decode_rows → events

``stream_events`` is the primitive for text; ``stream``, ``generate_text`` and ``generate_batch``
are thin layers over it, and ``generate_ids`` (``GPT.generate``) over the same loop for token ids.
What a prompt means depends on the model kind (``PROMPTS``): a decoder continues it; an
encoder–decoder translates it (the source is encoded once, ``EncoderDecoder.bind``, and the target
starts from ``<|endoftext|>``); a bidirectional encoder cannot generate. The loop itself, and how it
chooses an engine, is ``gptlab.generate.loop``; beam search is ``beam.py``. Prompts are cut from the
left to leave room for ``max_new_tokens`` (``step.fit_prompt``); past the context the window slides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from gptlab.errors import GptlabError
from gptlab.generate.beam import beam_search
from gptlab.generate.config import SampleConfig
from gptlab.generate.decoder import Decoder
from gptlab.generate.loop import decode_events, decode_rows, fit_prompts, start
from gptlab.generate.prefix_cache import PrefixCache
from gptlab.generate.seq2seq import bind_source, check_generative
from gptlab.generate.step import TokenEvent
from gptlab.model.encdec import EncoderDecoder

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer


def encode_prompt(tokenizer: Tokenizer, prompt: str) -> list[int]:
    """Token ids of ``prompt``; an empty prompt starts from ``<|endoftext|>`` when the tokenizer has it."""
    if not isinstance(prompt, str):
        raise GptlabError(f"a prompt must be a string, got {type(prompt).__name__}")
    ids = list(tokenizer.encode(prompt, allowed_special="all")) if prompt else []
    if not ids:
        eot = getattr(tokenizer, "eot_id", None)
        if eot is None:
            raise GptlabError(
                "the prompt is empty and the tokenizer has no <|endoftext|> to start from; give a prompt"
            )
        ids = [eot]
    return ids


def _continue_prompt(model: Decoder, tokenizer: Tokenizer, prompt: str) -> tuple[Decoder, list[int]]:
    """A decoder continues its prompt."""
    return model, encode_prompt(tokenizer, prompt)


def _cannot_generate(model: Decoder, tokenizer: Tokenizer, prompt: str) -> tuple[Decoder, list[int]]:
    check_generative(model)  # raises: a bidirectional encoder has no next-token distribution
    raise GptlabError("this model cannot generate")


PromptReader = Callable[[Decoder, Any, str], tuple[Decoder, list[int]]]
#: per model kind (``config.arch``): the model to decode and the ids it starts from
PROMPTS: dict[str, PromptReader] = {
    "decoder": _continue_prompt,
    "encoder-decoder": bind_source,
    "encoder": _cannot_generate,
}


def read_prompt(model: Decoder, tokenizer: Tokenizer, prompt: str) -> tuple[Decoder, list[int]]:
    """``prompt`` read for this kind of model → ``(the model to decode, its starting ids)``.

    Call it before printing anything: an empty source or a prompt the tokenizer refuses fails here.
    """
    if not isinstance(prompt, str):
        raise GptlabError(f"a prompt must be a string, got {type(prompt).__name__}")
    return PROMPTS[getattr(model.config, "arch", "decoder")](model, tokenizer, prompt)


def stream_events(
    model: Decoder,
    tokenizer: Tokenizer,
    prompt: str,
    config: SampleConfig | None = None,
    *,
    cache_dtype: torch.dtype | None = None,
    want_probs: bool = True,
    prefix_cache: PrefixCache | None = None,
) -> Iterator[TokenEvent]:
    """Generate from ``prompt``, yielding a ``TokenEvent`` per token (with its probability and the top 5).

    For an encoder–decoder the prompt is the source and the events are its target's tokens.
    ``prefix_cache`` (a ``PrefixCache`` kept between calls, as ``gptlab chat`` keeps one): the
    prompt reuses the keys and values of the longest prefix cached there, and leaves its own and
    its reply's. An encoder–decoder does not use it (its keys depend on the source as well).
    """
    config = config or SampleConfig()
    decoder, ids = read_prompt(model, tokenizer, prompt)
    if getattr(model.config, "arch", "decoder") != "decoder":
        prefix_cache = None
    yield from decode_events(decoder, tokenizer, ids, config, cache_dtype, want_probs, prefix_cache)


def stream(
    model: Decoder,
    tokenizer: Tokenizer,
    prompt: str,
    config: SampleConfig | None = None,
    *,
    cache_dtype: torch.dtype | None = None,
) -> Iterator[str]:
    """Yield text pieces as they are generated; a piece never ends inside a UTF-8 character."""
    for event in stream_events(model, tokenizer, prompt, config, cache_dtype=cache_dtype, want_probs=False):
        if event.text:
            yield event.text


def generate_text(
    model: Decoder,
    tokenizer: Tokenizer,
    prompt: str,
    config: SampleConfig | None = None,
    *,
    cache_dtype: torch.dtype | None = None,
) -> str:
    """The continuation of ``prompt`` (without the prompt, stop tokens or stop strings)."""
    return "".join(stream(model, tokenizer, prompt, config, cache_dtype=cache_dtype))


def generate_batch(
    model: Decoder,
    tokenizer: Tokenizer,
    prompts: Sequence[str],
    config: SampleConfig | None = None,
    *,
    cache_dtype: torch.dtype | None = None,
) -> list[str]:
    """Continue several prompts together (left-padded prefill, batched decode steps).

    Each result equals ``generate_text`` of that prompt alone: every request has its
    own sampler with ``config.seed``.
    """
    config = config or SampleConfig()
    if isinstance(prompts, str) or not prompts:
        raise GptlabError("generate_batch needs a non-empty list of prompt strings")
    read = [read_prompt(model, tokenizer, p) for p in prompts]
    shared = all(decoder is model for decoder, _ in read)  # an encoder-decoder binds each source alone
    if config.beam_width > 1 or not shared:
        return [generate_text(model, tokenizer, p, config, cache_dtype=cache_dtype) for p in prompts]
    session, rows = start(model, tokenizer, [ids for _, ids in read], config, cache_dtype)
    out = [""] * len(prompts)
    for event in decode_rows(session, rows):
        out[event.index] += event.text
    return out


def generate_ids(
    model: Decoder,
    idx: torch.Tensor,
    max_new_tokens: int,
    *,
    cache_dtype: torch.dtype | None = None,
    **sampling: Any,
) -> torch.Tensor:
    """``idx`` (B, T) followed by ``max_new_tokens`` generated ids → (B, T + max_new_tokens).

    A decoder-only model's continuation (an encoder–decoder's target: ``seq2seq.target_ids``).

    ``sampling`` takes any ``SampleConfig`` option (``temperature=0`` is greedy). Row b
    samples with seed ``seed + b``. A row that stops early (a stop token) is padded with
    that stop token. Past the context the window slides; with ``slide=False`` a row that
    reaches the context limit ends there and the result has fewer columns.
    """
    check_generative(model)  # a bidirectional encoder has no next-token distribution
    if isinstance(model, EncoderDecoder):
        raise GptlabError(
            "an encoder–decoder model generates from a source: use gptlab.generate.seq2seq.target_ids, "
            "or gptlab.generate.generate_text with the source as the prompt"
        )
    if not isinstance(idx, torch.Tensor) or idx.dim() != 2 or idx.size(1) == 0:
        raise GptlabError(
            f"idx must be a (B, T) tensor of token ids with T ≥ 1, got {getattr(idx, 'shape', idx)!r}"
        )
    config = SampleConfig(max_new_tokens=max_new_tokens, **sampling)
    prompts = idx.tolist()
    seeds = None if config.seed is None else [config.seed + b for b in range(len(prompts))]
    if config.beam_width > 1:
        fitted = fit_prompts(model, prompts, config)
        found = [beam_search(model, p, config, None, cache_dtype) for p in fitted]
        return _assemble(idx, prompts, [t for t, _ in found], [why for _, why in found], config)
    session, rows = start(model, None, prompts, config, cache_dtype, seeds)
    out: list[list[int]] = [[] for _ in prompts]
    for event in decode_rows(session, rows):
        if event.token_id is not None:
            out[event.index].append(event.token_id)
    return _assemble(idx, prompts, out, [r.step.reason for r in rows], config)


def _assemble(
    idx: torch.Tensor,
    prompts: list[list[int]],
    rows: list[list[int]],
    reasons: list[str | None],
    config: SampleConfig,
) -> torch.Tensor:
    """Prompt + continuation per row; rows that stopped early are padded with a stop token."""
    width = max(len(r) for r in rows) if "context" in reasons else config.max_new_tokens
    pad = min(config.stop_tokens) if config.stop_tokens else 0
    out = [p + r + [pad] * (width - len(r)) for p, r in zip(prompts, rows, strict=True)]
    return torch.tensor(out, dtype=idx.dtype, device=idx.device)
