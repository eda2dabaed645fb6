"""Direct Preference Optimization (Rafailov et al., 2023): ``objective = "dpo"``.

For a prompt x with a chosen answer y_w and a rejected one y_l (``gptlab.data.preference``):

    log π(y|x) = Σ_t m_t·log π(x_t | x_<t)         the answer's tokens only (mask m)
    r(y)       = β·(log π(y|x) − log π_ref(y|x))   the implicit reward of an answer
    Δ          = r(y_w) − r(y_l)                    the margin
    L          = −log σ(Δ)                          per pair, averaged over the batch

With label smoothing ε (the labels are flipped with probability ε, cDPO):

    L = −(1 − ε)·log σ(Δ) − ε·log σ(−Δ)

β (``beta``) sets how far the policy may move from the reference: small β, a weak pull back.

The reference π_ref is the model the run starts from (``init``):

* LoRA (``finetune = "lora"``): the same model with its adapters switched off
  (``gptlab.model.lora.adapters_disabled``), under ``torch.no_grad`` and in eval mode; no second
  copy of the weights in memory.
* Full fine-tuning: the initial model's log-probabilities of every sequence, computed once before
  the first step (float32, eval mode) and stored beside the prepared data as
  ``reference-<key>.safetensors``, ``key`` a hash of the starting weights, the model config and the
  dataset's files, so a different model never reuses them and a resumed run finds them.

A batch is B pairs; the chosen and the rejected sequences go through the model in one forward
pass of 2B rows (chosen rows first). Pair ``j`` of micro-batch ``m`` of step ``s`` on rank ``r`` is
``((s·A + m)·W + r)·B + j`` of a seeded order per epoch, so a resumed run sees the same pairs.

Logged per step (``step_metrics``): the reward accuracy (the share of pairs with r(y_w) > r(y_l),
a tie counting one half, so the starting model scores 50 %), the chosen and rejected rewards, the
margin, and the policy's log-probabilities of both answers. Evaluation on a split: the mean DPO
loss per pair (``val_loss``) and the same figures (``val_reward_accuracy``, ...).
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn.functional as F

from gptlab.errors import GptlabError
from gptlab.train import init
from gptlab.train.batches import Batch, to_device

if TYPE_CHECKING:
    from torch import nn

    from gptlab.data.dataset import TokenDataset
    from gptlab.data.preference import PreferenceDataset
    from gptlab.evaluate.loss import Autocast
    from gptlab.model import GPT

#: the per-step figures, in the order of ``_stats``' columns (``group/name`` keys share a plot panel)
STEP_METRICS = (
    "reward_accuracy",
    "reward/chosen",
    "reward/rejected",
    "reward_margin",
    "logp/chosen",
    "logp/rejected",
)
REFERENCE_PREFIX = "reference-"


def sequence_logprobs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``Σ_t log softmax(z_t)[y_t]`` over the positions whose target is not −1: (R, T, V), (R, T) → (R,)."""
    flat = F.cross_entropy(
        logits.float().flatten(0, 1), targets.flatten(), ignore_index=-1, reduction="none"
    )  # −log p per position, 0 where ignored
    return -flat.view(targets.shape).sum(-1)


def dpo_loss(
    policy: torch.Tensor, reference: torch.Tensor, beta: float, label_smoothing: float = 0.0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-pair ``(L, r(y_w), r(y_l))`` from the sequences' log-probabilities (2B,): chosen first, then rejected."""
    B = policy.size(0) // 2
    rewards = beta * (policy - reference)
    chosen, rejected = rewards[:B], rewards[B:]
    margin = chosen - rejected  # Δ
    losses = -(1.0 - label_smoothing) * F.logsigmoid(margin) - label_smoothing * F.logsigmoid(-margin)
    return losses, chosen, rejected


def _stats(chosen: torch.Tensor, rejected: torch.Tensor, policy: torch.Tensor) -> torch.Tensor:
    """The sums over pairs of each ``STEP_METRICS`` figure: (6,), detached."""
    B = chosen.size(0)
    margin = (chosen - rejected).detach()
    accuracy = (margin > 0).float() + 0.5 * (margin == 0).float()
    return torch.stack(
        [
            accuracy.sum(),
            chosen.detach().sum(),
            rejected.detach().sum(),
            margin.sum(),
            policy[:B].detach().sum(),
            policy[B:].detach().sum(),
        ]
    ).float()


def unwrapped(forward: nn.Module) -> GPT:
    """The model inside a compiled and/or DDP-wrapped forward."""
    inner: Any = getattr(forward, "_orig_mod", forward)
    model: GPT = getattr(inner, "module", inner)
    return model


@torch.no_grad()
def reference_logprobs(model: GPT, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``log π_ref`` of each row: ``model`` with its adapters off (if any), in eval mode, no gradient."""
    from gptlab.model.lora import adapters_disabled

    was = model.training
    model.eval()
    try:
        with adapters_disabled(model):
            return sequence_logprobs(model(x), y)
    finally:
        model.train(was)


# ------------------------------------------------------------------ stored reference (full fine-tuning)
def reference_key(base: dict[str, Any], model: GPT, data: TokenDataset) -> str:
    """What the stored reference depends on: the starting weights, the model config and the dataset's files."""
    h = hashlib.sha256()
    h.update(json.dumps([base, model.config.to_dict()], sort_keys=True, default=str).encode())
    for split in ("train", "val"):
        for suffix in ("bin", "mask.bin", "offsets.bin"):
            h.update((data.dir / f"{split}.{suffix}").read_bytes())
    return h.hexdigest()[:16]


def stored_reference(
    model: GPT, data: PreferenceDataset, base: dict[str, Any], batch_size: int
) -> dict[str, np.ndarray]:
    """``{split: (pairs, 2) log π_ref of (chosen, rejected)}``: read from the dataset directory, else computed
    with ``model`` (the starting weights) and written there (atomic; a read-only directory only warns)."""
    from safetensors.numpy import load_file, save

    from gptlab.fileio import atomic_write_bytes

    path = data.dir / f"{REFERENCE_PREFIX}{reference_key(base, model, data)}.safetensors"
    if path.is_file():
        try:
            stored = load_file(str(path))
            if all(stored[s].shape == (data.pairs(s), 2) for s in ("train", "val")):
                return {s: stored[s] for s in ("train", "val")}
        except (OSError, KeyError, ValueError, RuntimeError):
            pass  # unreadable or from elsewhere: computed again
    out: dict[str, np.ndarray] = {}
    for split in ("train", "val"):
        n = data.pairs(split)
        rows = []
        for start in range(0, n, batch_size):
            index = np.arange(start, min(start + batch_size, n))
            x, y = data.batch(split, index)
            logp = reference_logprobs(model, x.to(model.device), y.to(model.device)).cpu()
            rows.append(logp.view(2, -1).t())
        out[split] = torch.cat(rows).double().numpy().astype(np.float32)
    try:
        atomic_write_bytes(path, save(out, metadata={"model": json.dumps(base, default=str)}))
    except OSError as exc:
        warnings.warn(
            f"cannot store the reference log-probabilities in {path} ({exc}); kept in memory", stacklevel=2
        )
    return out


# ------------------------------------------------------------------ the objective
class DPO:
    """DPO over a preference dataset (``gptlab prepare --format preference``), from ``init`` pretrained weights.

    The objective interface of ``gptlab.train.objectives`` (``Objective``), on pairs instead of windows."""

    arch = "decoder"
    per_token = False  # the evaluation is a loss per pair: no perplexity, no bits per byte

    def __init__(self, cfg: Any, data_dir: Path, rank: int = 0, world_size: int = 1) -> None:
        from gptlab.data.preference import PreferenceDataset

        self.cfg, self.rank, self.world = cfg, rank, world_size
        self.data = PreferenceDataset(data_dir)
        self.tokenizer = self.data.tokenizer
        start = init.start(cfg, self.data)  # pretrained weights (init=SRC)
        if start is None:
            raise GptlabError(
                "objective=dpo needs init=SRC: the model to tune (its starting weights are the reference π_ref); "
                "e.g. init=smollm2 finetune=lora"
            )
        self.start: init.Start | None = start
        self.model_config = start.config
        if self.model_config.arch != self.arch:
            raise GptlabError(
                f"objective=dpo trains a decoder; init={cfg.init} is an {self.model_config.arch}"
            )
        self._setup(start)

    def _setup(self, start: init.Start) -> None:
        cfg = self.cfg
        longest = int(self.data.meta["longest"])
        if longest - 1 > self.model_config.block_size:
            raise GptlabError(
                f"the dataset's longest sequence has {longest} tokens, more than model.block_size="
                f"{self.model_config.block_size} + 1; raise model.block_size or prepare with a smaller --block-size"
            )
        self.n_train = self.data.pairs("train")
        self._orders: dict[int, np.ndarray] = {}
        self.beta, self.smoothing = (
            float(getattr(cfg, "beta", 0.1)),
            float(getattr(cfg, "label_smoothing", 0.0)),
        )
        self.reference: dict[str, np.ndarray] | None = None
        if cfg.finetune != "lora":  # the initial model's log-probabilities, computed once and stored
            self.reference = stored_reference(start.model, self.data, start.base, cfg.batch_size)
        self._step_stats: list[torch.Tensor] = []
        self._eval_stats: torch.Tensor | None = None

    # ----------------------------------------------------------- batches
    def _order(self, epoch: int) -> np.ndarray:
        from gptlab.data.pairs import pair_order

        if epoch not in self._orders:
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = pair_order(self.n_train, self.cfg.seed, epoch)
        return self._orders[epoch]

    def _pairs(self, split: str, index: np.ndarray) -> Batch:
        x, y = self.data.batch(split, index)
        if self.reference is None:
            return x, y
        ref = self.reference[split][index]  # (B, 2): chosen, rejected
        return x, y, torch.from_numpy(np.concatenate([ref[:, 0], ref[:, 1]]).astype(np.float32))

    def batch(self, step: int, micro: int, device: str) -> Batch:
        B = self.cfg.batch_size
        first = ((step * self.cfg.grad_accum + micro) * self.world + self.rank) * B
        epochs, ks = np.divmod(np.arange(first, first + B), self.n_train)
        index = np.array([self._order(int(e))[k] for e, k in zip(epochs, ks, strict=True)])
        return to_device(self._pairs("train", index), device)

    # ----------------------------------------------------------- the loss
    def _losses(
        self, run: Callable[[torch.Tensor], torch.Tensor], model: GPT, batch: Batch
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-pair losses and the pairs' figures (``_stats``), chosen and rejected in one pass of ``run``."""
        x, y, *stored = batch
        policy = sequence_logprobs(run(x), y)
        reference = stored[0] if stored else reference_logprobs(model, x, y)
        losses, chosen, rejected = dpo_loss(policy, reference.to(policy.dtype), self.beta, self.smoothing)
        return losses, _stats(chosen, rejected, policy)

    def loss(self, forward: nn.Module, batch: Batch) -> torch.Tensor:
        losses, stats = self._losses(forward, unwrapped(forward), batch)
        self._step_stats.append(stats / losses.size(0))
        return losses.mean()

    def step_metrics(self) -> dict[str, torch.Tensor]:
        """Contract B: the means over this step's micro-batches (0-d tensors: read with the loss, no sync)."""
        if not self._step_stats:
            return {}
        means = torch.stack(self._step_stats).mean(0)
        self._step_stats = []
        return dict(zip(STEP_METRICS, means.unbind(), strict=True))

    # ----------------------------------------------------------- evaluation
    def eval_sum(
        self, model: GPT, split: str, n: int, device: str, autocast: Autocast | None
    ) -> tuple[torch.Tensor, int]:
        """``(Σ per-pair DPO losses, pairs)`` over ``n`` batches of this rank's share of ``split``;
        ``eval_metrics()`` then gives the sums of the step figures over the same pairs."""
        import contextlib

        B, total = self.cfg.batch_size, self.data.pairs(split)
        starts = list(range(0, total, B))[: n * self.world][self.rank :: self.world]
        loss_sum = torch.zeros((), dtype=torch.float64, device=device)
        stats = torch.zeros(len(STEP_METRICS), dtype=torch.float64, device=device)
        count = 0
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                for s in starts:
                    batch = to_device(self._pairs(split, np.arange(s, min(s + B, total))), device)
                    with autocast if autocast is not None else contextlib.nullcontext():
                        losses, sums = self._losses(model, model, batch)
                    loss_sum += losses.double().sum()
                    stats += sums.double()
                    count += losses.size(0)
        finally:
            model.train(was)
        self._eval_stats = stats
        return loss_sum, count

    def eval_metrics(self) -> dict[str, torch.Tensor]:
        """Sums over the last ``eval_sum``'s pairs: ``reward_accuracy``, ``reward_chosen``, ... (the loop divides)."""
        if self._eval_stats is None:
            return {}
        stats, self._eval_stats = self._eval_stats, None
        return {name.replace("/", "_"): v for name, v in zip(STEP_METRICS, stats.unbind(), strict=True)}


def stored_references(data_dir: str | Path) -> list[Path]:
    """The reference log-probability files stored beside a preference dataset."""
    return sorted(Path(data_dir).glob(f"{REFERENCE_PREFIX}*.safetensors"))
