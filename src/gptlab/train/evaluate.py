"""Evaluation: mean cross-entropy (eq. 10 per token), perplexity and bits per byte.

loss = −(1/N)·Σ_t log P_θ(x_t | x_<t)   (nats per token)
perplexity = exp(loss)
bits per byte = loss / ln 2 · (tokens / UTF-8 bytes)   (comparable across tokenizers)
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from gptlab.errors import GptlabError


@dataclass
class EvalResult:
    loss: float
    tokens: int
    bytes_per_token: float
    context: int | None = None  # the window length scored (None: rows at their own length, or not a decoder)

    @property
    def perplexity(self) -> float:
        return math.exp(min(self.loss, 700.0))

    @property
    def bits_per_byte(self) -> float:
        return self.loss / math.log(2) / self.bytes_per_token

    def to_dict(self, prefix: str = "") -> dict[str, float]:
        return {
            f"{prefix}loss": self.loss,
            f"{prefix}ppl": self.perplexity,
            f"{prefix}bpb": self.bits_per_byte,
            f"{prefix}tokens": self.tokens,
        }


def loss_sum(
    model: Any,
    batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
    device: str | torch.device,
    autocast: Any = None,
) -> tuple[torch.Tensor, int]:
    """``(Σ token losses, token count)`` over ``batches`` (a float64 tensor sum, so ranks can all-reduce it).

    A batch is ``(x, y)``, or ``(x, y, kwargs)`` for rows of instruction data (``kwargs``: the packed
    examples' ``pos`` and ``attn_mask``, see ``gptlab.data.sampler.document_inputs``).
    """
    keys: list[str] = []

    def tensors(batch: tuple[Any, ...]) -> tuple[torch.Tensor, ...]:  # the target last
        if len(batch) == 2:
            return batch
        keys[:] = list(batch[2])
        return (batch[0], *batch[2].values(), batch[1])

    def run(m: Any, b: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return m.run(b[0], b[-1], **dict(zip(keys, b[1:-1], strict=True))).loss

    return target_loss_sum(model, map(tensors, batches), run, device, autocast)


@torch.no_grad()
def target_loss_sum(
    model: Any,
    batches: Iterable[tuple[torch.Tensor, ...]],
    run: Any,
    device: str | torch.device,
    autocast: Any = None,
) -> tuple[torch.Tensor, int]:
    """``(Σ losses, count)`` over the positions whose target (a batch's last tensor) is not −1.

    ``run(model, batch)`` returns the batch's mean loss over those positions.
    """
    was_training = model.training
    model.eval()
    total = torch.zeros((), dtype=torch.float64, device=device)
    count = 0
    try:
        for batch in batches:
            n = int((batch[-1] != -1).sum())  # counted on the host, before the copy: no device sync
            batch = tuple(t.to(device, non_blocking=True) for t in batch)
            with autocast if autocast is not None else contextlib.nullcontext():
                loss = run(model, batch)
            if n:  # a batch with no target at all has a NaN mean and adds nothing
                total += loss.double() * n
                count += n
    finally:
        model.train(was_training)
    return total, count


def evaluate_tokens(
    model: Any,
    tokens: Any,
    batch_size: int,
    bytes_per_token: float,
    device: str = "cpu",
    max_batches: int | None = None,
    autocast: Any = None,
    progress: bool = False,
    rows: dict[str, Any] | None = None,
    context: int | None = None,
) -> EvalResult:
    """Loss over non-overlapping windows of ``tokens`` (a 1-D id array) of ``context`` tokens (default:
    the model's context length); ``progress`` shows a bar (batches, rate, ETA) on stderr. ``rows``:
    instruction data's ``mask`` and ``pos`` (``TokenDataset.arrays``) and its ``block_size``: the rows,
    only the masked-in targets."""
    from tqdm import tqdm

    from gptlab.data import eval_batches, n_eval_batches

    rows = dict(rows or {})
    limit = model.config.block_size
    if context is not None and not 1 <= context <= limit:
        raise GptlabError(
            f"--context must be between 1 and the model's context of {limit} tokens, got {context}"
        )
    if context is not None and rows:
        raise GptlabError("instruction data is evaluated row by row, at its own length; leave out --context")
    T = rows.pop("block_size", None) or context or limit
    if len(tokens) < 2:
        raise GptlabError("the evaluation text has fewer than 2 tokens; give a longer text")
    T = min(T, len(tokens) - 1)
    batches = tqdm(
        eval_batches(tokens, T, batch_size, max_batches, **rows),
        total=n_eval_batches(len(tokens), T, batch_size, max_batches),
        disable=not progress,
        desc="eval",
        unit="batch",
        dynamic_ncols=True,
        mininterval=0.5,
    )
    with batches:
        total, count = loss_sum(model, batches, device, autocast)
    return EvalResult(
        loss=float(total) / max(count, 1),
        tokens=count,
        bytes_per_token=bytes_per_token,
        context=None if rows else T,  # instruction rows: each at its own length
    )


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
) -> tuple[EvalResult, str]:
    """Evaluate a checkpoint (or a run directory's latest) on a text file or a dataset split, in windows
    of ``context`` tokens (``EvalResult.context`` says which).

    The default is the context the model loads at: its own, and for a fine-tuning run (full or LoRA,
    merged or not) its base model's, which it keeps even when trained on shorter windows. So a base
    model, its LoRA run and their merge are scored on the same windows, and a text shorter than the
    context is one window for all three. Encoders and encoder–decoders score their own objective and
    take no ``context``."""
    import numpy as np

    from gptlab.checkpoint import load, resolve_checkpoint

    if batch_size < 1 or (max_batches is not None and max_batches < 1):
        raise GptlabError("--batch-size and --max-batches must be at least 1")
    if (text is None) == (data is None):
        raise GptlabError("give exactly one of --text FILE or --data DATA_DIR")
    directory = resolve_checkpoint(checkpoint)
    model, tok = load(directory, device=device)
    autocast = (
        torch.autocast(torch.device(device).type, dtype=torch.bfloat16) if dtype == "bfloat16" else None
    )
    if model.config.arch != "decoder":  # an encoder (masked tokens) or an encoder–decoder (pairs)
        if context is not None:
            raise GptlabError(f"--context is for decoder models; {directory} is an {model.config.arch}")
        from gptlab.train.objectives import evaluate_objective

        return evaluate_objective(model, text, data, split, batch_size, max_batches, device, autocast), (
            f"{directory} on {data} ({split})"
        )
    rows: dict[str, Any] | None = None
    if text is not None:
        from gptlab.tokenizers.loading import read_text_file

        if tok is None:
            raise GptlabError(
                f"{directory}: has no tokenizer.json, so a text cannot be tokenized; use --data"
            )
        content = read_text_file(text)
        ids = tok.encode(content)
        if len(ids) < 2:
            raise GptlabError(f"{text}: too short to evaluate (fewer than 2 tokens)")
        tokens = np.asarray(ids, dtype=np.int64)
        bpt = len(content.encode("utf-8")) / len(ids)
        source = str(text)
    else:
        from gptlab.data import TokenDataset

        ds = TokenDataset(data)
        if tok is not None and ds.tokenizer.to_dict() != tok.to_dict():
            raise GptlabError(
                f"{data} was tokenized with a different tokenizer than {directory}; "
                f"evaluate on a dataset prepared with the checkpoint's tokenizer.json"
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
