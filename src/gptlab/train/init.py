"""``init = SRC``: start training from pretrained weights instead of random ones.

``SRC`` is a gptlab checkpoint or run directory, a Hugging Face model folder, or a GGUF
file, opened by ``gptlab.sources``. The model config and the tokenizer come from ``SRC``; the weights are
copied unchanged, so the loss at step 0 is the pretrained model's loss on that batch:

    θ₀ = θ_pretrained,   L(θ₀; batch₀) = L_pretrained(batch₀)

Only settings that keep every weight's shape may be overridden (``model.dropout=0.1``,
or a shorter ``model.block_size`` where positions are computed, not looked up: RoPE,
ALiBi). ``finetune`` then chooses what trains (``FINETUNE``): every weight (``full``), or
low-rank adapters on a frozen base (``lora``, see ``gptlab.model.lora``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from gptlab.errors import GptlabError
from gptlab.model import GPT, GPTConfig, skip_init
from gptlab.model.state_dict import load_model_state, model_state
from gptlab.sources import load_source, resolve_source, source_kind, source_sha256

if TYPE_CHECKING:
    from gptlab.data.dataset import TokenDataset
    from gptlab.tokenizers.base import Tokenizer

PathLike = str | os.PathLike[str]


# ------------------------------------------------------------------ config overrides
def _refused(base: GPTConfig, key: str, value: Any) -> str | None:
    """Why ``model.{key}=value`` cannot change ``base``'s pretrained weights (None where it may): it
    changes a weight's shape, or it is a longer context than the pretrained one."""
    with skip_init(), torch.device("meta"):  # shapes only: nothing to initialise
        shapes = {k: v.shape for k, v in model_state(GPT(base)).items()}
        new = {k: v.shape for k, v in model_state(GPT(base.replace(**{key: value}))).items()}
    if new != shapes:
        return "it changes the shapes of the pretrained weights"
    if key == "block_size" and value > base.block_size:
        return f"the pretrained context is {base.block_size} tokens"
    return None


def finetune_config(base: GPTConfig, overrides: dict[str, Any], src: PathLike) -> GPTConfig:
    """``base`` with the ``model.*`` overrides that keep every weight's shape; anything else is refused."""
    if "preset" in overrides:
        raise GptlabError(f"model.preset cannot be combined with init={src}: the model config comes from it")
    for key, value in overrides.items():
        why = _refused(base, key, value)
        if why is not None:
            raise GptlabError(
                f"model.{key}={value!r} cannot be used with init={src}: {why}; only settings that "
                f"keep the weights' shapes (dropout, a shorter block_size with rope/alibi) may change"
            )
    return base.replace(**overrides) if overrides else base


#: The training windows of a run from pretrained weights over a token stream when ``model.block_size``
#: is not given and the pretrained context is longer (where computed positions let it be shorter):
#: Hugging Face's ``run_clm.py`` default, min(1024, the model's context). SmolLM2's 8,192-token windows
#: would hold ~40 GB of activations in a LoRA step of batch 4 (1.16 MB a token, measured).
WINDOW = 1024


def shorter_context(base: GPTConfig, overrides: dict[str, Any], window: int | None) -> int | None:
    """The ``block_size`` a run from ``base`` trains with where ``model.block_size`` is not among the
    ``overrides``: ``window`` where it is shorter than the pretrained context and allowed
    (``_refused``); None to keep the pretrained context."""
    if window is None or "block_size" in overrides or window >= base.block_size:
        return None
    return window if _refused(base, "block_size", window) is None else None


# ------------------------------------------------------------------ starting a run
class FinetuneSettings(Protocol):
    """The settings that start a run from pretrained weights (a ``TrainConfig`` has them all; a protocol,
    since ``gptlab.train.config`` imports this module to check them)."""

    init: str
    finetune: str
    model: dict[str, Any]
    lora_rank: int
    lora_alpha: float
    lora_dropout: float
    lora_targets: list[str]
    lora_base: str
    lora_lr_ratio: float


@dataclass
class Start:
    """The pretrained model a run starts from, its tokenizer and a reference to its weights."""

    model: GPT
    tokenizer: Tokenizer | None
    base: dict[str, Any] = field(default_factory=dict)  # {"path", "sha256", "kind"}
    shortened: int | None = None  # the pretrained context, where ``shorter_context`` shortened it

    @property
    def config(self) -> GPTConfig:
        return self.model.config


def check_tokenizer(tokenizer: Tokenizer | None, data: TokenDataset, src: PathLike, vocab_size: int) -> None:
    """The dataset must be tokenized by the model's own tokenizer."""
    if data.vocab_size > vocab_size:
        raise GptlabError(
            f"the dataset's vocabulary ({data.vocab_size}) is larger than the model's ({vocab_size}) "
            f"from init={src}; prepare it with --tokenizer {src}"
        )
    if tokenizer is not None and tokenizer.to_dict() != data.tokenizer.to_dict():
        raise GptlabError(
            f"{data.dir} was prepared with another tokenizer than the model of init={src}; "
            f"prepare it again with --tokenizer {src}"
        )


def start(cfg: FinetuneSettings, data: TokenDataset, window: int | None = None) -> Start | None:
    """Load ``cfg.init``, check the dataset's tokenizer, apply the shape-neutral ``model.*`` overrides
    (and, without ``model.block_size``, a context of ``window`` tokens where ``shorter_context`` allows it).

    None when the run starts from random weights (no ``init``), which only full training can.
    """
    src = cfg.init
    if not src:
        if cfg.finetune != "full":
            raise GptlabError(
                f"finetune={cfg.finetune} needs init=SRC (the pretrained checkpoint, Hugging Face folder "
                f"or GGUF file to adapt)"
            )
        return None
    model, tokenizer = load_source(src)
    check_tokenizer(tokenizer, data, src, model.config.vocab_size)
    overrides = dict(cfg.model)
    shorter = shorter_context(model.config, overrides, window)
    if shorter is not None:
        overrides["block_size"] = shorter
    config = finetune_config(model.config, overrides, src)
    if config != model.config:
        state = model_state(model)
        pretrained_context = model.config.block_size
        model = GPT(config)
        load_model_state(model, state, src)
        model.pretrained_context = pretrained_context  # checkpoints keep it (checkpoint.context_extra)
    base = {"path": str(resolve_source(src)), "sha256": source_sha256(src), "kind": source_kind(src)}
    shortened = getattr(model, "pretrained_context", None) if shorter is not None else None
    return Start(model=model, tokenizer=tokenizer, base=base, shortened=shortened)


def _full(model: GPT, cfg: FinetuneSettings, base: dict[str, Any]) -> GPT:
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def _lora(model: GPT, cfg: FinetuneSettings, base: dict[str, Any]) -> GPT:
    from gptlab.model.lora import LoRASpec, apply_lora
    from gptlab.train.lora import set_lr_ratio

    spec = LoRASpec(
        rank=cfg.lora_rank,
        alpha=cfg.lora_alpha,
        dropout=cfg.lora_dropout,
        targets=list(cfg.lora_targets),
        base_format=cfg.lora_base,
        base=base,
    )
    return set_lr_ratio(apply_lora(model, spec), cfg.lora_lr_ratio)


#: ``finetune`` → what trains.
FINETUNE: dict[str, Callable[[GPT, FinetuneSettings, dict[str, Any]], GPT]] = {"full": _full, "lora": _lora}


def finetune_model(begin: Start, cfg: FinetuneSettings) -> GPT:
    """The model to train: ``FINETUNE[cfg.finetune]`` applied to the pretrained one."""
    return FINETUNE[cfg.finetune](begin.model, cfg, begin.base)


__all__ = [
    "FINETUNE",
    "WINDOW",
    "Start",
    "check_settings",
    "check_tokenizer",
    "finetune_config",
    "finetune_model",
    "shorter_context",
    "start",
]


def check_settings(cfg: FinetuneSettings, need: Callable[[bool, str], None]) -> None:
    """Validate the fine-tuning fields of a ``TrainConfig`` (``need(ok, message)`` raises)."""
    from gptlab.model.lora import BASE_FORMATS

    need(cfg.finetune in FINETUNE, f"finetune must be one of {', '.join(FINETUNE)}; got {cfg.finetune!r}")
    need(cfg.lora_rank >= 1, f"lora_rank must be at least 1, got {cfg.lora_rank}")
    need(cfg.lora_alpha > 0, f"lora_alpha must be positive, got {cfg.lora_alpha}")
    need(0.0 <= cfg.lora_dropout < 1.0, f"lora_dropout must be in [0, 1), got {cfg.lora_dropout}")
    need(cfg.lora_lr_ratio > 0, f"lora_lr_ratio must be positive, got {cfg.lora_lr_ratio}")
    need(
        isinstance(cfg.lora_targets, list)
        and bool(cfg.lora_targets)
        and all(isinstance(t, str) for t in cfg.lora_targets),
        f'lora_targets must be a list of layer names such as ["qkv", "attn.proj"], got {cfg.lora_targets!r}',
    )
    need(
        cfg.lora_base in BASE_FORMATS,
        f"lora_base must be one of {', '.join(BASE_FORMATS)}; got {cfg.lora_base!r}",
    )
