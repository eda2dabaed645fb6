"""Evaluation: mean cross-entropy (eq. 10 per token), perplexity and bits per byte.

loss = −(1/N)·Σ_t log P_θ(x_t | x_<t)   (nats per token)
perplexity = exp(loss)
bits per byte = loss / ln 2 · (tokens / UTF-8 bytes)   (comparable across tokenizers)
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from gptlab.errors import GptlabError

if TYPE_CHECKING:
    import numpy as np

    from gptlab.model import GPT

Autocast = contextlib.AbstractContextManager[Any]  # torch.autocast(...), entered around each batch


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
    model: GPT,
    batches: Iterable[tuple[Any, ...]],
    device: str | torch.device,
    autocast: Autocast | None = None,
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

    def run(m: GPT, b: tuple[torch.Tensor, ...]) -> torch.Tensor | None:
        inputs: dict[str, Any] = dict(zip(keys, b[1:-1], strict=True))  # pos, attn_mask
        return m.run(b[0], b[-1], **inputs).loss

    return target_loss_sum(model, map(tensors, batches), run, device, autocast)


@torch.no_grad()
def target_loss_sum(
    model: GPT,
    batches: Iterable[tuple[torch.Tensor, ...]],
    run: Callable[[GPT, tuple[torch.Tensor, ...]], torch.Tensor | None],
    device: str | torch.device,
    autocast: Autocast | None = None,
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
            assert loss is not None  # run gives the model its targets
            if n:  # a batch with no target at all has a NaN mean and adds nothing
                total += loss.double() * n
                count += n
    finally:
        model.train(was_training)
    return total, count


def evaluate_tokens(
    model: GPT,
    tokens: np.ndarray,
    batch_size: int,
    bytes_per_token: float,
    device: str = "cpu",
    max_batches: int | None = None,
    autocast: Autocast | None = None,
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
