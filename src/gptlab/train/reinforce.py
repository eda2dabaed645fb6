"""Reinforcement from a verifiable reward: policy gradient with a group baseline (``objective = "grpo"``).

Each micro-batch takes ``B`` prompts ``x`` (``gptlab prepare --format prompts``) and, for each,
samples a group of ``G = group_size`` completions ``y_1 … y_G ~ π_θ(· | x)`` through gptlab's own
batched, KV-cached generation (``gptlab.generate``: the model in eval mode, no gradient, at
``rl_temperature``, at most ``rl_max_new_tokens``, ending at the chat template's end of turn).
The user's reward function scores each, ``r_i = R(x, y_i)``, and the group is its own baseline:

    A_i = r_i − mean_j r_j                                   advantage_std = false
    A_i = (r_i − mean_j r_j) / (std_j r_j + ε)               advantage_std = true (ε = 10⁻⁴, population std)

    L_PG(θ) = −(1 / Σ_i |y_i|) · Σ_i Σ_t A_i · log π_θ(y_{i,t} | x, y_{i,<t})      per token, over the group

    L(θ) = L_PG(θ) + β · (1 / Σ_i |y_i|) · Σ_i Σ_t k3_{i,t},    β = kl_coef
    k3_{i,t} = ρ − log ρ − 1,   ρ = π_ref(y_{i,t} | …) / π_θ(y_{i,t} | …)            (≥ 0; E[k3] = KL(π_θ ‖ π_ref))

This is GRPO's objective (Shao et al., 2024) with one gradient step per sampled batch: the
sampling policy is the policy being differentiated, so PPO's ratio is 1 and its clipping never
acts; what is left is REINFORCE with the group mean as the baseline, ``∇L_PG = −Σ A_i ∇log π(y_i|x)``.
A group whose rewards are all equal has ``A = 0`` and teaches nothing (its share is logged).
Only the completion's tokens count, its end-of-turn token included (so the model learns to stop).

The reference ``π_ref`` of the KL penalty: with LoRA, the same model with its adapters switched off
(``gptlab.model.lora.adapters_disabled``: no second copy); with full fine-tuning, a frozen copy of the
starting weights, made when the run starts (one more model's weights in memory). Without
``kl_coef`` there is no reference forward at all.

The reward function (``reward = "path/to/file.py:function"``) is the user's own Python code, imported
with ``importlib`` and run in the training process: ``function(prompt, completion)`` or
``function(prompt, completion, example) → float``, where ``prompt`` is the user's text (the last user
turn), ``completion`` the decoded answer (without the end-of-turn token) and ``example`` the whole
prompt record (its extra fields, such as ``"answer"``). A bool counts as 1.0/0.0. A function that
raises, or returns NaN, ±inf or something that is not a number, stops the run with one
``GptlabError`` line naming the file, the function and the prompt; the checkpoints already written
stay, so ``--resume`` carries on once it is fixed.

Resuming redraws exactly: the completions of micro-batch ``m`` of step ``s`` on rank ``r`` are
sampled with seeds drawn from ``(seed, s, m, r)``, and its prompts are a function of the same
(``((s·A + m)·W + r)·B + j`` over a seeded order per epoch), so under DDP each rank samples its own.

Evaluation (``eval_every``): the held-out ``val`` prompts (and as many train prompts) are answered
greedily, one completion each; the logged ``val_loss`` is ``−mean reward`` (so the best checkpoint
is the one with the highest held-out reward). Per step, ``step_metrics`` gives the mean reward, the
spread within groups (mean of the groups' std), the completion length, the KL estimate and the
share of groups with zero advantage.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import torch

from gptlab.data.prompts import PromptDataset
from gptlab.errors import GptlabError
from gptlab.model import GPTConfig
from gptlab.train import init
from gptlab.train.rollouts import (
    RewardFunction,
    completion_rows,
    group_advantages,
    held_out_reward,
    policy_loss,
    sample_completions,
    score,
    token_logprobs,
    unwrap,
    without_stop,
)

if TYPE_CHECKING:
    from torch import nn

    from gptlab.evaluate.loss import Autocast
    from gptlab.model import GPT

Batch = tuple[torch.Tensor, ...]


# ---------------------------------------------------------------- settings
class ReinforceSettings(init.FinetuneSettings, Protocol):
    """The settings this objective reads (a ``TrainConfig`` has them all; a protocol, since
    ``gptlab.train.config`` imports this module to check them)."""

    objective: str
    batch_size: int
    grad_accum: int
    seed: int
    reward: str
    group_size: int
    kl_coef: float
    rl_max_new_tokens: int
    rl_temperature: float
    advantage_std: bool
    strategy: str

    def model_config(self, vocab_size: int) -> GPTConfig: ...


def check_settings(cfg: Any, need: Callable[[bool, str], None]) -> None:
    """Validate the reinforcement fields of a ``TrainConfig`` (``need(ok, message)`` raises)."""
    need(
        cfg.group_size >= 2,
        f"group_size must be at least 2 (the group is its own baseline), got {cfg.group_size}",
    )
    need(cfg.kl_coef >= 0, f"kl_coef must be ≥ 0 (0: no KL penalty), got {cfg.kl_coef}")
    need(cfg.rl_max_new_tokens >= 1, f"rl_max_new_tokens must be at least 1, got {cfg.rl_max_new_tokens}")
    need(
        math.isfinite(cfg.rl_temperature) and cfg.rl_temperature > 0,
        f"rl_temperature must be > 0 (completions are sampled), got {cfg.rl_temperature}",
    )
    if cfg.objective != "grpo":
        return
    need(
        bool(cfg.reward) and ":" in cfg.reward,
        f'objective="grpo" needs reward="path/to/file.py:function" (a Python function of '
        f"(prompt, completion) → float), got {cfg.reward!r}",
    )
    need(
        cfg.strategy == "ddp",
        f'objective="grpo" samples with whole weights on each rank: use strategy="ddp", not {cfg.strategy!r}',
    )


# ---------------------------------------------------------------- the objective
class GRPO:
    """Policy gradient with a group baseline over a prompts dataset (the module docstring).

    The objective interface of ``gptlab.train.objectives`` (``batch``, ``loss``, ``eval_sum``,
    ``step_metrics``, ``eval_metrics``; ``data``, ``tokenizer``, ``start``, ``model_config``), written
    out here rather than inherited, so that this module does not import the registry that names it.
    """

    arch = "decoder"
    per_token = (
        False  # an evaluation scores prompts (a reward each), not tokens: no perplexity nor bits per byte
    )

    def __init__(self, cfg: ReinforceSettings, data_dir: Path, rank: int = 0, world_size: int = 1) -> None:
        self.cfg, self.rank, self.world = cfg, rank, world_size
        self.data = PromptDataset(data_dir)
        self.tokenizer = self.data.tokenizer
        self.start = init.start(cfg, self.data)  # pretrained weights (init=SRC), or None
        self.model_config = self.start.config if self.start else self._model_config()
        self._setup()

    def _model_config(self) -> GPTConfig:
        config = self.cfg.model_config(self.data.vocab_size)
        if config.arch != self.arch:
            raise GptlabError(
                f'objective="grpo" trains a decoder, but model.arch={config.arch!r}; drop model.arch'
            )
        return config

    def _setup(self) -> None:
        from gptlab.tokenizers.chat import stop_ids

        c = self.cfg
        longest = self.data.longest()
        room = self.model_config.block_size - c.rl_max_new_tokens
        if longest > room:
            raise GptlabError(
                f"the longest prompt has {longest} tokens and completions up to rl_max_new_tokens="
                f"{c.rl_max_new_tokens} more: over the model's context ({self.model_config.block_size}); "
                f"lower rl_max_new_tokens or shorten the prompts"
            )
        self.reward = RewardFunction(c.reward)
        self.stops = frozenset(stop_ids(self.tokenizer))
        if not self.stops:
            raise GptlabError(
                "the tokenizer has no end-of-turn or <|endoftext|> token: completions could not stop; "
                "use the model's own tokenizer"
            )
        self.n_train = self.data.count("train")
        self._orders: dict[int, np.ndarray] = {}
        self.reference: GPT | None = None
        if c.kl_coef > 0 and c.finetune == "full":
            self.reference = self._frozen_reference()
        self._sums: dict[str, float] = {}
        self._kl: torch.Tensor | float = 0.0
        self._micro = 0
        self._eval_reward: float | None = None

    def _frozen_reference(self) -> GPT:
        """A frozen copy of the weights the run starts from (full fine-tuning's reference)."""
        if self.start is not None:
            reference = copy.deepcopy(self.start.model)
        else:  # from random weights: the loop's own initialisation (torch.manual_seed(seed), build_model)
            from gptlab.model import build_model

            torch.manual_seed(self.cfg.seed)
            reference = build_model(self.model_config)
        for p in reference.parameters():
            p.requires_grad_(False)
        return reference.eval()

    # ------------------------------------------------------------ batches
    def _order(self, epoch: int) -> np.ndarray:
        if epoch not in self._orders:
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = np.random.default_rng([self.cfg.seed, epoch]).permutation(self.n_train)
        return self._orders[epoch]

    def batch(self, step: int, micro: int, device: str) -> Batch:
        """The train prompts of micro-batch ``micro`` of ``step`` on this rank, and the key ``(step, micro)``;
        prompt ``j`` is number ``((step·A + micro)·W + rank)·B + j`` of the epochs' seeded orders."""
        B = self.cfg.batch_size
        first = ((step * self.cfg.grad_accum + micro) * self.world + self.rank) * B
        epochs, ks = np.divmod(np.arange(first, first + B), self.n_train)
        index = [int(self._order(int(e))[k]) for e, k in zip(epochs, ks, strict=True)]
        return torch.tensor(index, dtype=torch.long), torch.tensor([step, micro], dtype=torch.long)

    def seeds(self, step: int, micro: int, n: int) -> list[int]:
        """The sampling seeds of a micro-batch's ``n`` completions: a function of (seed, step, micro, rank)."""
        state = np.random.SeedSequence([self.cfg.seed, step, micro, self.rank]).generate_state(n)
        return [int(s) for s in state]

    # ------------------------------------------------------------ the loss
    def loss(self, forward: nn.Module, batch: Batch) -> torch.Tensor:
        c = self.cfg
        index_t, key = batch
        step, micro = (int(v) for v in key.tolist())
        index = [int(i) for i in index_t.tolist()]
        policy = unwrap(forward)
        G = c.group_size
        prompts = [self.data.prompt_ids("train", i) for i in index for _ in range(G)]
        completions = sample_completions(
            policy,
            prompts,
            max_new_tokens=c.rl_max_new_tokens,
            temperature=c.rl_temperature,
            stop_tokens=sorted(self.stops),
            seeds=self.seeds(step, micro, len(prompts)),
        )
        rewards, _ = score(
            self.reward,
            self.data,
            self.tokenizer,
            "train",
            [i for i in index for _ in range(G)],
            completions,
            self.stops,
        )
        grouped = rewards.view(len(index), G)
        advantages = group_advantages(grouped, c.advantage_std).flatten()
        pad = self.tokenizer.eot_id if self.tokenizer.eot_id is not None else min(self.stops)
        x, y = completion_rows(prompts, completions, pad)
        device = policy.device
        x, y = x.to(device), y.to(device)
        logp = token_logprobs(forward(x), y)
        ref_logp = self._reference_logprobs(policy, x, y) if c.kl_coef > 0 else None
        mask = y >= 0
        loss, kl = policy_loss(logp, advantages.to(device), mask, ref_logp, c.kl_coef)
        self._record(grouped, [len(without_stop(ids, self.stops)) for ids in completions], kl)
        return loss

    def _reference_logprobs(self, policy: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """``log π_ref`` of the targets: the adapters switched off (LoRA) or the frozen copy (full)."""
        from gptlab.model.lora import adapters_disabled, is_lora_model

        was_training = policy.training
        with torch.no_grad():
            if self.reference is not None:
                self.reference.to(policy.device)
                return token_logprobs(self.reference(x), y)
            if not is_lora_model(policy):  # pragma: no cover - _setup makes a copy for full fine-tuning
                raise GptlabError("kl_coef > 0 needs a reference model")
            policy.eval()
            try:
                with adapters_disabled(policy):
                    return token_logprobs(policy(x), y)
            finally:
                policy.train(was_training)

    # ------------------------------------------------------------ metrics
    def _record(self, rewards: torch.Tensor, lengths: list[int], kl: torch.Tensor) -> None:
        std = rewards.std(dim=1, unbiased=False)
        values = {
            "reward": float(rewards.mean()),
            "reward_std": float(std.mean()),
            "completion_len": float(np.mean(lengths)),
            "zero_adv_frac": float((std == 0).double().mean()),
        }
        for k, v in values.items():
            self._sums[k] = self._sums.get(k, 0.0) + v
        self._kl = self._kl + kl  # a tensor on the device: read with the loss, no sync here
        self._micro += 1

    def step_metrics(self) -> dict[str, float | torch.Tensor]:
        """Mean reward, spread within groups (mean group std), completion length (tokens), KL (k3 per
        token, a 0-d tensor) and share of groups with zero advantage, averaged over the micro-batches
        since the last call (then reset)."""
        if not self._micro:
            return {}
        out: dict[str, float | torch.Tensor] = {k: v / self._micro for k, v in self._sums.items()}
        out["kl"] = self._kl / self._micro
        self._sums, self._kl, self._micro = {}, 0.0, 0
        return out

    def eval_metrics(self) -> dict[str, torch.Tensor]:
        """``reward``: the sum of the rewards of the last ``eval_sum`` (the loop divides by the prompts)."""
        if self._eval_reward is None:
            return {}
        total, self._eval_reward = self._eval_reward, None
        return {"reward": torch.tensor(total, dtype=torch.float64)}

    # ------------------------------------------------------------ evaluation
    def eval_sum(
        self, model: GPT, split: str, n: int, device: str, autocast: Autocast | None
    ) -> tuple[torch.Tensor, int]:
        """``(−Σ rewards, prompts)`` of greedy answers to ``n`` batches of ``split``'s prompts (this rank's
        share): the logged loss is −(mean reward)."""
        B, total = self.cfg.batch_size, self.data.count(split)
        starts = list(range(0, total, B))[: n * self.world][self.rank :: self.world]
        total_reward, count = 0.0, 0
        for s in starts:
            index = list(range(s, min(s + B, total)))
            done = sample_completions(
                model,
                [self.data.prompt_ids(split, i) for i in index],
                max_new_tokens=self.cfg.rl_max_new_tokens,
                temperature=0.0,
                stop_tokens=sorted(self.stops),
            )
            rewards, _ = score(self.reward, self.data, self.tokenizer, split, index, done, self.stops)
            total_reward += float(rewards.sum())
            count += len(index)
        self._eval_reward = total_reward
        return torch.tensor(-total_reward, dtype=torch.float64, device=device), count


__all__ = [
    "GRPO",
    "ReinforceSettings",
    "RewardFunction",
    "check_settings",
    "completion_rows",
    "group_advantages",
    "held_out_reward",
    "policy_loss",
    "sample_completions",
    "score",
    "token_logprobs",
    "unwrap",
]
