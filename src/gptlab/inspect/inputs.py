"""Turning the user's input into token ids and printable token labels (blueprint stage 1)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

from gptlab.errors import GptlabError
from gptlab.model import GPT
from gptlab.tokenizers.loading import parse_ids

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer


def token_ids(model: GPT, tokenizer: Tokenizer | None, text: str | Sequence[int] | torch.Tensor) -> list[int]:
    """Encode ``text`` (or check a given id list) for ``model``: non-empty, in the vocabulary, fits the context."""
    if isinstance(text, str):
        if tokenizer is None:
            raise GptlabError(
                "this model has no tokenizer, so text cannot be encoded; pass token ids instead "
                '(on the command line: --ids "1 2 3")'
            )
        if not text:
            raise GptlabError("the text is empty; give at least one character to trace")
        ids = list(tokenizer.encode(text))
    else:
        ids = text.flatten().tolist() if isinstance(text, torch.Tensor) else list(text)
        if not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise GptlabError("token ids must be integers")
    if not ids:
        raise GptlabError("the input has no tokens; give some text or ids")
    V, T_max = model.config.vocab_size, model.config.block_size
    bad = [i for i in ids if not 0 <= i < V]
    if bad:
        raise GptlabError(f"token id {bad[0]} is outside the model's vocabulary (0..{V - 1})")
    if len(ids) > T_max:
        raise GptlabError(f"the input is {len(ids)} tokens but the model's context is {T_max}; shorten it")
    return ids


def token_label(tokenizer: Tokenizer | None, token_id: int) -> str:
    """A printable rendering of one token: its bytes with control characters escaped, or ``#id``."""
    if tokenizer is None:
        return f"#{token_id}"
    from gptlab.tokenizers.render import render_token

    try:
        return render_token(tokenizer.token_bytes(token_id))
    except GptlabError:  # an id the tokenizer does not know (model vocab larger than the tokenizer's)
        return f"#{token_id}"


def token_labels(tokenizer: Tokenizer | None, ids: Sequence[int]) -> list[str]:
    return [token_label(tokenizer, i) for i in ids]


def cli_input(text: str | None, ids: str | None) -> str | list[int]:
    """The command line's input: TEXT, or ``--ids "1 2 3"`` (exactly one)."""
    if text is not None and ids is not None:
        raise GptlabError("give either TEXT or --ids, not both")
    if ids is not None:
        return parse_ids(ids)
    if text is None:
        raise GptlabError('no input: give TEXT (e.g. "The cat sat on") or --ids "1 2 3"')
    return text


def load_checkpoint(path: str, device: str = "cpu") -> tuple[GPT, Tokenizer | None]:
    """``gptlab.load(path)`` onto ``device``, in eval mode."""
    from gptlab.sources import load

    return load(path, device=device)


def plot_label(label: str) -> str:
    """A token label for a plot axis: a space is drawn as ``␣`` so it stays visible."""
    return label.replace(" ", "␣")
