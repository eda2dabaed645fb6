"""``init = SRC``: start training from pretrained weights instead of random ones.

``SRC`` is a gptlab checkpoint or run directory, a Hugging Face model folder, or a GGUF
file (``SOURCES``). The model config and the tokenizer come from ``SRC``; the weights are
copied unchanged, so the loss at step 0 is the pretrained model's loss on that batch:

    θ₀ = θ_pretrained,   L(θ₀; batch₀) = L_pretrained(batch₀)

Only settings that keep every weight's shape may be overridden (``model.dropout=0.1``,
or a shorter ``model.block_size`` where positions are computed, not looked up: RoPE,
ALiBi). ``finetune`` then chooses what trains (``FINETUNE``): every weight (``full``), or
low-rank adapters on a frozen base (``lora``, see ``gptlab.train.lora``).
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from gptlab.errors import GptlabError
from gptlab.model import GPT, GPTConfig

PathLike = str | os.PathLike[str]
_SKIP_HASH = ("train_state",)  # a training checkpoint's optimizer state is not part of the weights


def _is_gptlab(path: Path) -> bool:
    from gptlab.checkpoint import CONFIG_FILE, list_checkpoints, read_json

    if (path / CONFIG_FILE).is_file():
        data = read_json(path / CONFIG_FILE)
        return isinstance(data, dict) and "gptlab_format" in data
    return bool(list_checkpoints(path))


def source_path(src: PathLike) -> Path:
    """``src`` as a path; a short name of a GGUF file that a package carries (``smollm2``) that names
    nothing here becomes that file (``gptlab.interop.gguf.resolve``). An existing path always wins."""
    path = Path(src)
    if path.exists():
        return path
    try:
        gguf = _gguf_module()
    except GptlabError:  # no GGUF support here, so no short names either
        return path
    return Path(gguf.resolve(path))


def source_kind(src: PathLike) -> str:
    """``gguf`` (a ``.gguf`` file), ``gptlab`` (checkpoint or run directory) or ``hf`` (a folder with config.json)."""
    path = source_path(src)
    if not path.exists():
        raise GptlabError(f"init={src}: no such checkpoint, run directory, Hugging Face folder or GGUF file")
    if path.is_file() and path.suffix.lower() == ".gguf":
        return "gguf"
    if path.is_dir() and _is_gptlab(path):
        return "gptlab"
    if path.is_dir() and (path / "config.json").is_file():
        return "hf"
    raise GptlabError(
        f"init={src}: not a gptlab checkpoint or run, a Hugging Face folder (config.json) or a .gguf file"
    )


def is_model_source(spec: str) -> bool:
    """True when ``spec`` names a model that carries a tokenizer (for ``prepare --tokenizer SRC``)."""
    try:
        source_kind(spec)
    except GptlabError:
        return False
    return True


def _gguf_module() -> Any:
    try:
        return importlib.import_module("gptlab.interop.gguf")
    except ModuleNotFoundError as exc:
        if exc.name not in ("gptlab.interop.gguf", "gguf"):
            raise
        raise GptlabError(
            f"reading GGUF files needs gptlab.interop.gguf and the gguf package ({exc.name} is missing)"
        ) from None


def _load_gptlab(path: Path) -> tuple[GPT, Any | None]:
    from gptlab.checkpoint import load, stored_format

    if stored_format(path) is not None:  # int8 inference weights: nothing to train, nothing to adapt in float
        raise GptlabError(
            f"{path}: holds int8 inference weights, which cannot be trained; start from the float "
            "checkpoint (for QLoRA-like fine-tuning: lora with base_format int8 on the float checkpoint)"
        )
    return load(path)


def _load_hf(path: Path) -> tuple[GPT, Any | None]:
    from gptlab.interop.hf import from_hf, tokenizer_from_hf

    return from_hf(path), tokenizer_from_hf(path)


def _load_gguf(path: Path) -> tuple[GPT, Any | None]:
    gguf = _gguf_module()
    return gguf.from_gguf(path), gguf.tokenizer_from_gguf(path)


#: Source kind → reader returning ``(model in float32, tokenizer or None)``.
SOURCES: dict[str, Callable[[Path], tuple[GPT, Any | None]]] = {
    "gptlab": _load_gptlab,
    "hf": _load_hf,
    "gguf": _load_gguf,
}


def resolve_source(src: PathLike) -> Path:
    """The exact weights ``src`` names: a run directory resolves to its latest checkpoint."""
    from gptlab.checkpoint import resolve_checkpoint

    path = source_path(src).resolve()
    return resolve_checkpoint(path) if source_kind(path) == "gptlab" else path


def load_source(src: PathLike) -> tuple[GPT, Any | None]:
    """``(model, tokenizer)`` from a gptlab checkpoint/run, a Hugging Face folder or a GGUF file."""
    path = source_path(src)
    model, tokenizer = SOURCES[source_kind(path)](path)
    return model.float(), tokenizer


def source_tokenizer(src: PathLike) -> Any:
    """The tokenizer that comes with a model (``prepare --tokenizer SRC``)."""
    path = source_path(src)
    kind = source_kind(path)
    if kind == "gptlab":
        from gptlab.checkpoint import load_tokenizer, resolve_checkpoint

        tok = load_tokenizer(resolve_checkpoint(path))
    else:
        tok = _gguf_module().tokenizer_from_gguf(path) if kind == "gguf" else SOURCES[kind](path)[1]
    if tok is None:
        raise GptlabError(f"{src}: this model carries no tokenizer gptlab can read")
    return tok


def source_sha256(src: PathLike) -> str:
    """sha256 of a source's content: the file itself, or a folder's files (names and bytes, sorted)."""
    path = resolve_source(src)
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    for p in files:
        if p.name.startswith(_SKIP_HASH):
            continue
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()


# ------------------------------------------------------------------ config overrides
def finetune_config(base: GPTConfig, overrides: dict[str, Any], src: PathLike) -> GPTConfig:
    """``base`` with the ``model.*`` overrides that keep every weight's shape; anything else is refused."""
    from gptlab.checkpoint import model_state

    if "preset" in overrides:
        raise GptlabError(f"model.preset cannot be combined with init={src}: the model config comes from it")
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in model_state(GPT(base)).items()}
        for key, value in overrides.items():
            changed = base.replace(**{key: value})
            new = {k: v.shape for k, v in model_state(GPT(changed)).items()}
            if new != shapes or (key == "block_size" and value > base.block_size):
                why = (
                    f"the pretrained context is {base.block_size} tokens"
                    if new == shapes
                    else "it changes the shapes of the pretrained weights"
                )
                raise GptlabError(
                    f"model.{key}={value!r} cannot be used with init={src}: {why}; only settings that "
                    f"keep the weights' shapes (dropout, a shorter block_size with rope/alibi) may change"
                )
    return base.replace(**overrides) if overrides else base


# ------------------------------------------------------------------ starting a run
@dataclass
class Start:
    """The pretrained model a run starts from, its tokenizer and a reference to its weights."""

    model: GPT
    tokenizer: Any | None
    base: dict[str, Any] = field(default_factory=dict)  # {"path", "sha256", "kind"}

    @property
    def config(self) -> GPTConfig:
        return self.model.config


def check_tokenizer(tokenizer: Any | None, data: Any, src: PathLike, vocab_size: int) -> None:
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


def start(cfg: Any, data: Any) -> Start | None:
    """Load ``cfg.init``, check the dataset's tokenizer, apply the shape-neutral ``model.*`` overrides.

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
    config = finetune_config(model.config, dict(cfg.model), src)
    if config != model.config:
        from gptlab.checkpoint import load_model_state, model_state

        state = model_state(model)
        pretrained_context = model.config.block_size
        model = GPT(config)
        load_model_state(model, state, src)
        model.pretrained_context = pretrained_context  # checkpoints keep it (checkpoint.context_extra)
    base = {"path": str(resolve_source(src)), "sha256": source_sha256(src), "kind": source_kind(src)}
    return Start(model=model, tokenizer=tokenizer, base=base)


def _full(model: GPT, cfg: Any, base: dict[str, Any]) -> GPT:
    for p in model.parameters():
        p.requires_grad_(True)
    return model


def _lora(model: GPT, cfg: Any, base: dict[str, Any]) -> GPT:
    from gptlab.train.lora import LoRASpec, apply_lora, set_lr_ratio

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
FINETUNE: dict[str, Callable[[GPT, Any, dict[str, Any]], GPT]] = {"full": _full, "lora": _lora}


def finetune_model(begin: Start, cfg: Any) -> GPT:
    """The model to train: ``FINETUNE[cfg.finetune]`` applied to the pretrained one."""
    return FINETUNE[cfg.finetune](begin.model, cfg, begin.base)


__all__ = [
    "FINETUNE",
    "SOURCES",
    "Start",
    "check_tokenizer",
    "finetune_config",
    "finetune_model",
    "is_model_source",
    "load_source",
    "resolve_source",
    "source_kind",
    "source_sha256",
    "source_tokenizer",
    "start",
]


def check_settings(cfg: Any, need: Callable[[bool, str], None]) -> None:
    """Validate the fine-tuning fields of a ``TrainConfig`` (``need(ok, message)`` raises)."""
    from gptlab.train.lora import BASE_FORMATS

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
