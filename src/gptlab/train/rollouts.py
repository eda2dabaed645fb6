"""The pieces of reinforcement from a reward (``gptlab.train.reinforce``, whose docstring has the equations):
the user's reward function, the group advantage, the per-token policy loss, and sampling completions
through gptlab's own batched, KV-cached generation.

    A_i = (r_i − mean_j r_j) [/ (std_j r_j + ε)]                 group_advantages
    L = −(1/Σ|y_i|)·Σ_i Σ_t A_i·log π(y_i,t | …) + β·mean k3       policy_loss
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import math
import numbers
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from gptlab.errors import GptlabError

if TYPE_CHECKING:
    from gptlab.data.prompts import PromptDataset
    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer

EPS = 1e-4  # ε of the standardised advantage


# ---------------------------------------------------------------- the reward function
class RewardFunction:
    """``reward = "path/to/file.py:function"``, imported from the file (user code, run in this process)."""

    def __init__(self, spec: str) -> None:
        path_text, _, name = spec.rpartition(":")
        self.path, self.name = Path(path_text), name
        self.label = f"{path_text}:{name}"
        if not path_text or not name:
            raise GptlabError(f'reward={spec!r}: give "path/to/file.py:function"')
        if not self.path.is_file():
            raise GptlabError(f"reward={spec!r}: no such file {self.path}")
        module_name = "gptlab_reward_" + hashlib.sha256(str(self.path.resolve()).encode()).hexdigest()[:12]
        loader_spec = importlib.util.spec_from_file_location(module_name, self.path)
        if loader_spec is None or loader_spec.loader is None:
            raise GptlabError(f"reward={spec!r}: {self.path} cannot be imported as a Python file")
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[module_name] = module
        try:
            loader_spec.loader.exec_module(module)
        except Exception as exc:
            sys.modules.pop(module_name, None)
            raise GptlabError(
                f"reward file {self.path} failed to import: {type(exc).__name__}: {_one_line(exc)}"
            ) from None
        fn = getattr(module, name, None)
        if not callable(fn):
            raise GptlabError(f"reward={spec!r}: {self.path} has no function {name!r}")
        self.fn: Callable[..., Any] = fn
        self.takes_example = _accepts(fn, 3)
        if not self.takes_example and not _accepts(fn, 2):
            raise GptlabError(
                f"reward function {self.label} must take (prompt, completion) or (prompt, completion, example)"
            )

    def __call__(self, prompt: str, completion: str, example: dict[str, Any], where: str) -> float:
        """The reward of one completion as a float; anything else is one error line naming ``where``."""
        try:
            value = (
                self.fn(prompt, completion, example) if self.takes_example else self.fn(prompt, completion)
            )
        except Exception as exc:
            raise GptlabError(
                f"reward function {self.label} raised {type(exc).__name__}: {_one_line(exc)} "
                f"(on {where}); fix it and resume the run (its checkpoints are kept)"
            ) from None
        if not isinstance(value, numbers.Real):
            raise GptlabError(
                f"reward function {self.label} returned {type(value).__name__} {_short(value)}, not a number "
                f"(on {where}); it must return a float"
            )
        out = float(value)
        if not math.isfinite(out):
            raise GptlabError(
                f"reward function {self.label} returned {out} (on {where}); it must return a finite float"
            )
        return out


def _accepts(fn: Callable[..., Any], n: int) -> bool:
    try:
        inspect.signature(fn).bind(*range(n))
    except TypeError:
        return False
    except ValueError:  # no signature (a builtin): try the two-argument form
        return n == 2
    return True


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or "(no message)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ---------------------------------------------------------------- the maths
def group_advantages(rewards: torch.Tensor, standardise: bool, eps: float = EPS) -> torch.Tensor:
    """``A = r − mean_group(r)``, divided by ``std_group(r) + ε`` when ``standardise``; rewards (B, G)."""
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if not standardise:
        return centred
    return centred / (rewards.std(dim=1, unbiased=False, keepdim=True) + eps)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``log π(y_t | …)`` of each target (B, T) under ``logits`` (B, T, V); targets −1 give 0."""
    flat = F.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten().clamp(min=0), reduction="none"
    ).view_as(targets)
    return -flat * (targets >= 0)


def policy_loss(
    logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L, mean k3)``: the module docstring's loss over rows (N, T) of completion tokens (``mask``),
    ``advantages`` (N,) per row; the KL term only when ``ref_logp`` is given."""
    m = mask.to(logp.dtype)
    n = m.sum().clamp(min=1.0)
    loss = -(advantages.to(logp.dtype)[:, None] * logp * m).sum() / n
    kl = torch.zeros((), device=logp.device)
    if ref_logp is not None:
        delta = ref_logp - logp  # log ρ
        k3 = (torch.exp(delta) - delta - 1.0) * m
        kl = k3.sum() / n
        loss = loss + kl_coef * kl
    return loss, kl.detach()


def completion_rows(
    prompts: Sequence[Sequence[int]], completions: Sequence[Sequence[int]], pad: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x, y)`` (N, L): each prompt + completion right-padded; ``y`` holds the completion's tokens at
    the positions that predict them, −1 elsewhere (the prompt and the padding)."""
    seqs = [list(p) + list(c) for p, c in zip(prompts, completions, strict=True)]
    width = max(len(s) for s in seqs) - 1
    x = torch.full((len(seqs), width), pad, dtype=torch.long)
    y = torch.full((len(seqs), width), -1, dtype=torch.long)
    for i, (s, p) in enumerate(zip(seqs, prompts, strict=True)):
        x[i, : len(s) - 1] = torch.tensor(s[:-1])
        y[i, len(p) - 1 : len(s) - 1] = torch.tensor(s[len(p) :])
    return x, y


# ---------------------------------------------------------------- sampling
def unwrap(forward: Any) -> GPT:
    """The model inside a training forward (a compiled module, DDP)."""
    model = getattr(forward, "_orig_mod", forward)
    return getattr(model, "module", model)  # type: ignore[no-any-return]


def sample_completions(
    model: GPT,
    prompts: Sequence[Sequence[int]],
    *,
    max_new_tokens: int,
    temperature: float,
    stop_tokens: Sequence[int],
    seeds: Sequence[int] | None = None,
) -> list[list[int]]:
    """One completion per prompt, batched through the KV cache (``gptlab.generate``), the model in eval
    mode and without gradients; a completion that ended on a stop token keeps it last."""
    from gptlab.generate import SampleConfig
    from gptlab.generate.driver import decode_rows, start

    config = SampleConfig(
        max_new_tokens=max_new_tokens, temperature=temperature, stop_tokens=list(stop_tokens), slide=False
    )
    was_training = model.training
    model.eval()
    out: list[list[int]] = [[] for _ in prompts]
    try:
        with torch.no_grad(), torch.autocast(model.device.type, enabled=False):
            session, rows = start(model, None, [list(p) for p in prompts], config, None, seeds)
            for event in decode_rows(session, rows):
                if event.token_id is not None and not event.stop:
                    out[event.index].append(event.token_id)
            for row in rows:
                if row.state.stop_event is not None and row.state.stop_event.token_id is not None:
                    out[row.state.index].append(row.state.stop_event.token_id)
    finally:
        model.train(was_training)
    return out


def without_stop(ids: Sequence[int], stops: frozenset[int]) -> list[int]:
    return list(ids[:-1]) if ids and ids[-1] in stops else list(ids)


def score(
    reward: RewardFunction,
    data: PromptDataset,
    tokenizer: Tokenizer,
    split: str,
    index: Sequence[int],
    completions: Sequence[Sequence[int]],
    stops: frozenset[int],
) -> tuple[torch.Tensor, list[str]]:
    """Rewards (N,) of ``completions``, completion ``k`` answering prompt ``index[k]`` of ``split``."""
    values, texts = [], []
    for i, ids in zip(index, completions, strict=True):
        prompt, example = data.record(split, i)
        text = tokenizer.decode(without_stop(ids, stops))
        texts.append(text)
        values.append(reward(prompt, text, example, f"{split} prompt {i}"))
    return torch.tensor(values, dtype=torch.float64), texts


def held_out_reward(
    model: GPT,
    data: PromptDataset,
    reward: RewardFunction,
    split: str = "val",
    *,
    max_new_tokens: int = 64,
    batch: int = 16,
    limit: int | None = None,
) -> tuple[float, list[str]]:
    """``(mean reward, completions)`` of greedy answers to the prompts of ``split`` (the first ``limit``)."""
    from gptlab.tokenizers.chat import stop_ids

    tokenizer = data.tokenizer
    stops = frozenset(stop_ids(tokenizer))
    n = data.count(split) if limit is None else min(limit, data.count(split))
    total, texts = 0.0, []
    for s in range(0, n, batch):
        index = list(range(s, min(s + batch, n)))
        done = sample_completions(
            model,
            [data.prompt_ids(split, i) for i in index],
            max_new_tokens=max_new_tokens,
            temperature=0.0,
            stop_tokens=sorted(stops),
        )
        rewards, out = score(reward, data, tokenizer, split, index, done, stops)
        total += float(rewards.sum())
        texts += out
    return total / max(n, 1), texts


__all__ = [
    "EPS",
    "RewardFunction",
    "completion_rows",
    "group_advantages",
    "held_out_reward",
    "policy_loss",
    "sample_completions",
    "score",
    "token_logprobs",
    "unwrap",
    "without_stop",
]
