"""``gptlab eval SRC --text FILE | --data DATA_DIR``: a model's loss, perplexity and bits per byte on a
text file or a dataset split.

A decoder scores its next-token loss in windows (``gptlab.evaluate.loss.evaluate_tokens``). An encoder or
an encoder–decoder scores its own training objective (masked tokens, target tokens), which the trainer
defines: that scorer comes in as ``objective=gptlab.train.objective_eval.evaluate_objective``, passed by
the CLI, because the trainer sits above this package (it imports ``gptlab.evaluate.loss`` for its
periodic evaluation).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gptlab.errors import GptlabError
from gptlab.evaluate.loss import Autocast, EvalResult, evaluate_tokens
from gptlab.sources import load, resolve_source

if TYPE_CHECKING:
    from gptlab.model import GPT


class ObjectiveEval(Protocol):
    """A model that is not a decoder scored on its training objective on a dataset split
    (``gptlab.train.objective_eval.evaluate_objective``)."""

    def __call__(
        self,
        model: GPT,
        text: str | os.PathLike[str] | None,
        data: str | os.PathLike[str] | None,
        split: str,
        batch_size: int,
        max_batches: int | None,
        device: str,
        autocast: Autocast | None = None,
    ) -> EvalResult: ...


def evaluate_path(
    checkpoint: str | os.PathLike[str],
    text: str | os.PathLike[str] | None = None,
    data: str | os.PathLike[str] | None = None,
    split: str = "val",
    batch_size: int = 16,
    max_batches: int | None = None,
    dtype: str = "float32",
    device: str = "cpu",
    progress: bool = False,
    context: int | None = None,
    objective: ObjectiveEval | None = None,
) -> tuple[EvalResult, str]:
    """Evaluate a model (any source ``gptlab.sources`` opens; a run directory: its latest checkpoint) on
    a text file or a dataset split, in windows of ``context`` tokens (``EvalResult.context`` says which).

    The default is the context the model loads at: its own, and for a fine-tuning run (full or LoRA,
    merged or not) its base model's, which it keeps even when trained on shorter windows. So a base
    model, its LoRA run and their merge are scored on the same windows, and a text shorter than the
    context is one window for all three. Encoders and encoder–decoders score their own objective
    through ``objective`` and take no ``context``."""
    import numpy as np

    if batch_size < 1 or (max_batches is not None and max_batches < 1):
        raise GptlabError("--batch-size and --max-batches must be at least 1")
    if (text is None) == (data is None):
        raise GptlabError("give exactly one of --text FILE or --data DATA_DIR")
    directory = resolve_source(checkpoint)  # any source: a run directory → its latest checkpoint
    model, tok = load(directory, device=device)
    autocast = (
        torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if dtype == "bfloat16" else None
    )
    if model.config.arch != "decoder":  # an encoder (masked tokens) or an encoder–decoder (pairs)
        if context is not None:
            raise GptlabError(f"--context is for decoder models; {directory} is an {model.config.arch}")
        if objective is None:
            raise GptlabError(
                f"{directory} is an {model.config.arch}, scored on its training objective: pass "
                "objective=gptlab.train.objective_eval.evaluate_objective (`gptlab eval` does)"
            )
        return objective(model, text, data, split, batch_size, max_batches, device, autocast), (
            f"{directory} on {data} ({split})"
        )
    rows: dict[str, Any] | None = None
    if text is not None:
        from gptlab.tokenizers.loading import read_text_file

        if tok is None:
            raise GptlabError(f"{directory}: has no tokenizer, so a text cannot be tokenized; use --data")
        content = read_text_file(text)
        ids = tok.encode(content)
        if len(ids) < 2:
            raise GptlabError(f"{text}: too short to evaluate (fewer than 2 tokens)")
        tokens = np.asarray(ids, dtype=np.int64)
        bpt = len(content.encode("utf-8")) / len(ids)
        source = str(text)
    else:
        from gptlab.data import TokenDataset

        assert data is not None  # exactly one of text and data (checked above)
        ds = TokenDataset(data)
        if tok is not None and ds.tokenizer.to_dict() != tok.to_dict():
            raise GptlabError(
                f"{data} was tokenized with a different tokenizer than {directory}; "
                f"evaluate on a dataset prepared with the model's tokenizer"
            )
        if ds.vocab_size > model.config.vocab_size:
            raise GptlabError(
                f"{data} has a vocabulary of {ds.vocab_size}, larger than the model's "
                f"{model.config.vocab_size}"
            )
        tokens = ds.split(split)
        bpt = ds.bytes_per_token(split)
        if ds.meta.get("row_tokens"):  # instruction data: whole rows, assistant tokens only
            rows = {**ds.arrays(split), "block_size": ds.meta["row_tokens"] - 1}
        source = f"{data} ({split})"
    if max_batches is None and len(tokens) > 50_000_000:
        max_batches = 1000
    result = evaluate_tokens(
        model,
        tokens,
        batch_size,
        bpt,
        device=device,
        max_batches=max_batches,
        autocast=autocast,
        progress=progress,
        rows=rows,
        context=context,
    )
    return result, f"{directory} on {source}"


__all__ = ["ObjectiveEval", "evaluate_path"]
