"""Training objectives, chosen by name (``TrainConfig.objective``): what a batch is and what the loss is.

    causal   L = −(1/N)·Σ_t log P_θ(x_t | x_<t)                      next token (eq. 10), a decoder
    mlm      L = −(1/|C|)·Σ_{i∈C} log P_θ(x_i | x̃)                    masked tokens, a bidirectional encoder
    seq2seq  L = −(1/N_y)·Σ_t log P_θ(y_t | y_<t, x)                  target tokens, an encoder–decoder
    dpo      L = −log σ(β·[(log π(y_w|x) − log π_ref(y_w|x))
                           − (log π(y_l|x) − log π_ref(y_l|x))])      preference pairs (train/preference.py)
    grpo     L = −(1/Σ|y_i|)·Σ_i Σ_t A_i·log π_θ(y_i,t | x, y_i,<t)   sampled completions (gptlab.train.reinforce)

MLM (BERT's recipe): each position is chosen with probability ``mlm_rate`` (15 %) into
``C``; a chosen token becomes ``[MASK]`` with probability 0.8, a random token with 0.1
and stays itself with 0.1, giving the input ``x̃``; the loss is taken at ``C`` only (the
targets elsewhere are −1, which the cross-entropy ignores). The masks are a function of
``(seed, step, micro-batch, rank)``, so a resumed run draws the same ones.

The training loop calls an objective through one interface: ``batch(step, micro)``,
``loss(forward, batch)``, ``eval_sum(model, split, ...)``, plus ``model_config``,
``tokenizer`` (with ``[MASK]`` added where needed) and ``data``; optionally ``step_metrics()``,
``eval_metrics()`` and ``per_token`` (``gptlab.train.loop``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np
import torch

from gptlab.data import TokenDataset, WindowSampler, eval_batches, eval_windows
from gptlab.errors import GptlabError
from gptlab.evaluate.loss import target_loss_sum
from gptlab.model import GPTConfig
from gptlab.train import init
from gptlab.train.batches import Batch, to_device

if TYPE_CHECKING:
    from torch import nn

    from gptlab.data.pairs import PairDataset
    from gptlab.evaluate.loss import Autocast
    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer

MASK = "[MASK]"


def with_mask_token(tokenizer: Tokenizer) -> Tokenizer:
    """``tokenizer`` with a ``[MASK]`` special token (the next free id) unless it has one."""
    if MASK in tokenizer.special_tokens:
        return tokenizer
    from gptlab.tokenizers import from_dict

    data = tokenizer.to_dict()
    data["special_tokens"] = {**data["special_tokens"], MASK: tokenizer.vocab_size}
    return from_dict(data)


def mlm_mask(
    x: torch.Tensor, mask_id: int, vocab_size: int, generator: torch.Generator, rate: float = 0.15
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT's corruption of ``x`` (B, T) → ``(inputs, targets)``; targets are −1 off the chosen positions."""
    chosen = torch.rand(x.shape, generator=generator) < rate
    chosen.view(-1)[0] |= ~chosen.any()  # at least one position, so the loss is defined (no host branch)
    r = torch.rand(x.shape, generator=generator)
    rand = torch.randint(0, vocab_size - 1, x.shape, generator=generator)
    rand = rand + (rand >= mask_id).long()  # a random token other than [MASK]
    inputs = torch.where(chosen & (r < 0.8), torch.full_like(x, mask_id), x)
    inputs = torch.where(chosen & (r >= 0.8) & (r < 0.9), rand, inputs)
    return inputs, torch.where(chosen, x, torch.full_like(x, -1))


def _generator(*key: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(np.random.SeedSequence(list(key)).generate_state(1)[0]))


class ObjectiveSettings(init.FinetuneSettings, Protocol):
    """The settings an objective reads (a ``TrainConfig`` has them all; a protocol, since
    ``gptlab.train.config`` imports this module to check ``objective``)."""

    objective: str
    batch_size: int
    grad_accum: int
    seed: int
    mlm_rate: float

    def model_config(self, vocab_size: int) -> GPTConfig: ...


class CausalLM:
    """Next-token prediction over windows of the token stream (a decoder)."""

    arch = "decoder"
    per_token = True  # eval_sum sums token losses (perplexity and bits per byte apply)
    dataset_type: type[TokenDataset] = TokenDataset
    _keys: list[str] = []  # noqa: RUF012  (names of a batch's keyword inputs after x and y; set per batch)

    def __init__(self, cfg: ObjectiveSettings, data_dir: Path, rank: int = 0, world_size: int = 1) -> None:
        self.cfg, self.rank, self.world = cfg, rank, world_size
        self.data = self.dataset_type(data_dir)
        self.tokenizer = self._tokenizer()
        # pretrained weights (init=SRC), or None; without model.block_size, windows of the dataset's
        # rows (instruction data) or of at most init.WINDOW tokens
        rows = self.data.meta.get("row_tokens")
        self.start = init.start(cfg, self.data, int(rows) - 1 if rows else init.WINDOW)
        self.model_config = self.start.config if self.start else self._model_config()
        self._setup()

    def _tokenizer(self) -> Tokenizer:
        return self.data.tokenizer

    def _vocab_size(self) -> int:
        """The model's vocabulary: the dataset's ids (a larger tokenizer is refused at train start)."""
        return self.data.vocab_size

    def _model_config(self) -> GPTConfig:
        config = self.cfg.model_config(self._vocab_size())
        if config.arch == self.arch:
            return config
        if "arch" in self.cfg.model:
            raise GptlabError(
                f"objective={self.cfg.objective!r} trains arch={self.arch!r}, but model.arch={config.arch!r}; "
                f"drop model.arch or change the objective"
            )
        return config.replace(arch=self.arch)

    def _setup(self) -> None:
        c = self.cfg
        self.sampler = WindowSampler(
            self.data.split("train"),
            self.model_config.block_size,
            c.batch_size,
            seed=c.seed,
            grad_accum=c.grad_accum,
            world_size=self.world,
            rank=self.rank,
            **self.data.arrays(
                "train", self.model_config.block_size
            ),  # instruction data: loss mask, examples
        )
        # every run evaluates (at its last step at least): a split too short for one window is
        # refused now, not after the training steps before the first evaluation
        T = self.model_config.block_size
        rows = bool(self.data.arrays("val", T))
        eval_windows(len(self.data.split("val")), T, rows, "the validation split")

    def batch(self, step: int, micro: int, device: str) -> Batch:
        x, y, kwargs = self.sampler.inputs(step, micro)
        self._keys = list(kwargs)  # packed examples: pos, attn_mask (gptlab.data.sampler.document_inputs)
        return to_device((x, y, *kwargs.values()), device)

    def loss(self, forward: nn.Module, batch: Batch) -> torch.Tensor:
        x, y, *extra = batch
        _, loss = forward(x, y, **dict(zip(self._keys, extra, strict=True)))
        return loss

    def _eval_windows(self, split: str, n: int) -> Iterable[Batch]:
        T, B = self.model_config.block_size, self.cfg.batch_size
        rows = self.data.arrays(split, T)
        return islice(
            eval_batches(self.data.split(split), T, B, n * self.world, **rows), self.rank, None, self.world
        )

    def eval_sum(
        self, model: GPT, split: str, n: int, device: str, autocast: Autocast | None
    ) -> tuple[torch.Tensor, int]:
        """``(Σ token losses, tokens)`` over ``n`` evaluation batches (this rank's share)."""
        from gptlab.evaluate.loss import loss_sum

        return loss_sum(model, self._eval_windows(split, n), device, autocast)


class MaskedLM(CausalLM):
    """BERT's masked-language modelling over windows of the token stream (a bidirectional encoder)."""

    arch = "encoder"

    def _tokenizer(self) -> Tokenizer:
        return with_mask_token(self.data.tokenizer)

    def _vocab_size(self) -> int:
        return max(self.data.vocab_size, self.tokenizer.vocab_size)  # room for [MASK]

    def _setup(self) -> None:
        super()._setup()
        self.mask_id = self.tokenizer.special_tokens[MASK]

    def _corrupt(self, x: torch.Tensor, *key: int) -> Batch:
        g = _generator(self.cfg.seed, *key)
        return mlm_mask(x, self.mask_id, self.model_config.vocab_size, g, self.cfg.mlm_rate)

    def batch(self, step: int, micro: int, device: str) -> Batch:
        x, _ = self.sampler.batch(step, micro)
        return to_device(self._corrupt(x, step, micro, self.rank), device)

    def eval_sum(
        self, model: GPT, split: str, n: int, device: str, autocast: Autocast | None
    ) -> tuple[torch.Tensor, int]:
        batches = (self._corrupt(x, 1 << 30, i) for i, (x, _) in enumerate(self._eval_windows(split, n)))
        return target_loss_sum(model, batches, lambda m, b: m.run(*b).loss, device, autocast)


class Seq2Seq(CausalLM):
    """Target tokens given the source, over a pairs dataset (an encoder–decoder)."""

    arch = "encoder-decoder"
    data: PairDataset

    @property
    def dataset_type(self) -> type[TokenDataset]:  # type: ignore[override]
        from gptlab.data.pairs import PairDataset

        return PairDataset

    def _setup(self) -> None:
        meta = self.data.meta
        longest = max(int(meta["source_len"]), int(meta["target_len"]) - 1)
        if longest > self.model_config.block_size:
            raise GptlabError(
                f"the dataset's longest sequence has {longest} tokens, more than model.block_size="
                f"{self.model_config.block_size}; raise model.block_size"
            )
        self.n_train = len(self.data.rows("train")[0])
        self._orders: dict[int, np.ndarray] = {}

    def _order(self, epoch: int) -> np.ndarray:
        from gptlab.data.pairs import pair_order

        if epoch not in self._orders:
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = pair_order(self.n_train, self.cfg.seed, epoch)
        return self._orders[epoch]

    def batch(self, step: int, micro: int, device: str) -> Batch:
        """Row ``j`` of micro-batch ``m`` of step ``s`` on rank ``r`` is sample ``((s·A + m)·W + r)·B + j``."""
        B = self.cfg.batch_size
        first = ((step * self.cfg.grad_accum + micro) * self.world + self.rank) * B
        epochs, ks = np.divmod(np.arange(first, first + B), self.n_train)
        index = np.array([self._order(int(e))[k] for e, k in zip(epochs, ks, strict=True)])
        return to_device(self.data.batch("train", index), device)

    def loss(self, forward: nn.Module, batch: Batch) -> torch.Tensor:
        src, src_mask, tgt_in, tgt_out = batch
        _, loss = forward(tgt_in, tgt_out, source=src, source_mask=src_mask)
        return loss

    def eval_sum(
        self, model: GPT, split: str, n: int, device: str, autocast: Autocast | None
    ) -> tuple[torch.Tensor, int]:
        from gptlab.model import EncoderDecoder

        B, total = self.cfg.batch_size, len(self.data.rows(split)[0])
        starts = list(range(0, total, B))[: n * self.world][self.rank :: self.world]
        batches = (self.data.batch(split, np.arange(s, min(s + B, total))) for s in starts)

        def run(m: GPT, b: Batch) -> torch.Tensor | None:
            assert isinstance(m, EncoderDecoder)  # this objective trains arch="encoder-decoder"
            return m.run(b[2], b[3], source=b[0], source_mask=b[1]).loss

        return target_loss_sum(model, batches, run, device, autocast)


class Objective(Protocol):
    """What the training loop and ``gptlab eval`` use of an objective (``CausalLM`` and its kin, ``DPO``)."""

    @property
    def data(self) -> TokenDataset: ...
    @property
    def model_config(self) -> GPTConfig: ...
    @property
    def tokenizer(self) -> Tokenizer: ...
    @property
    def start(self) -> init.Start | None: ...

    def batch(self, step: int, micro: int, device: str) -> Batch: ...
    def loss(self, forward: nn.Module, batch: Batch) -> torch.Tensor: ...
    def eval_sum(
        self, model: GPT, split: str, n: int, device: str, autocast: Autocast | None
    ) -> tuple[torch.Tensor, int]: ...


def _dpo(cfg: ObjectiveSettings, data_dir: Path, rank: int, world_size: int) -> Objective:
    from gptlab.train.preference import DPO  # a module of its own (it does not import this one)

    return DPO(cfg, data_dir, rank, world_size)


def _grpo(cfg: ObjectiveSettings, data_dir: Path, rank: int, world_size: int) -> CausalLM:
    from gptlab.train.reinforce import GRPO  # reinforcement from a reward: the same interface, not a subclass

    return cast("CausalLM", GRPO(cfg, data_dir, rank, world_size))  # type: ignore[arg-type]


#: ``objective`` → the class (or a function that builds it from ``(cfg, data_dir, rank, world_size)``)
OBJECTIVES: dict[str, Callable[[ObjectiveSettings, Path, int, int], Objective]] = {
    "causal": CausalLM,
    "mlm": MaskedLM,
    "seq2seq": Seq2Seq,
    "dpo": _dpo,
    "grpo": _grpo,
}


def make_objective(
    cfg: ObjectiveSettings, data_dir: str | os.PathLike[str], rank: int = 0, world_size: int = 1
) -> Objective:
    """The objective ``cfg.objective`` names, over the dataset in ``data_dir``."""
    return OBJECTIVES[cfg.objective](cfg, Path(data_dir), rank, world_size)


#: the objective a trained model is evaluated with, by ``config.arch``
ARCH_OBJECTIVES = {"decoder": "causal", "encoder": "mlm", "encoder-decoder": "seq2seq"}
