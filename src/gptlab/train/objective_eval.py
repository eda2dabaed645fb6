"""An encoder's or an encoder–decoder's held-out loss: its training objective's evaluation sum on a
dataset split (``gptlab eval`` of a model that is not a decoder).

    mlm      −(1/|C|)·Σ_{i∈C} log P_θ(x_i | x̃)      masked tokens (the masks drawn as in training)
    seq2seq  −(1/N_y)·Σ_t log P_θ(y_t | y_<t, x)     target tokens

The objectives are the trainer's (``gptlab.train.objectives``), built from a ``TrainConfig``, so this
sits in ``train/``; ``gptlab.evaluate.text.evaluate_path`` takes it as its ``objective`` (the CLI passes
it), since the evaluation package sits below the trainer.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gptlab.errors import GptlabError
from gptlab.evaluate.loss import Autocast, EvalResult
from gptlab.train.config import TrainConfig
from gptlab.train.objectives import ARCH_OBJECTIVES, make_objective

if TYPE_CHECKING:
    from gptlab.model import GPT


def evaluate_objective(
    model: GPT,
    text: str | os.PathLike[str] | None,
    data: str | os.PathLike[str] | None,
    split: str,
    batch_size: int,
    max_batches: int | None,
    device: str,
    autocast: Autocast | None = None,
) -> EvalResult:
    """``gptlab eval`` of an encoder (masked-token loss) or an encoder–decoder (target-token loss) on ``data``."""
    name = ARCH_OBJECTIVES[model.config.arch]
    if text is not None:
        raise GptlabError(f"a {model.config.arch} model is evaluated on a dataset: use --data DATA_DIR")
    assert data is not None  # exactly one of text and data (evaluate_path checks)
    cfg = TrainConfig(objective=name, batch_size=batch_size, model=model.config.to_dict())
    objective = make_objective(cfg, data)
    total, count = objective.eval_sum(model, split, max_batches or 1 << 30, device, autocast)
    if count == 0:
        raise GptlabError(f"{data}: the {split} split has nothing to evaluate")
    return EvalResult(float(total) / count, count, objective.data.bytes_per_token(split))


__all__ = ["evaluate_objective"]
