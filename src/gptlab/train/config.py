"""``TrainConfig``: every setting of a training run in one dataclass, plus TOML recipes and overrides.

A config file is TOML: top-level keys are ``TrainConfig`` fields and a ``[model]``
table holds ``GPTConfig`` fields (``preset = "..."`` picks a base preset; the
default base is ``char-tiny``). Overrides are ``key=value`` strings whose
value is read as TOML (``lr=3e-3``, ``compile=true``, ``model.pos="rope"``; a bare
word is a string). Built-in recipes live in ``gptlab/train/recipes/<name>.toml`` and are
named without the suffix: ``--config char-best``. ``gptlab train`` without ``--config``
trains ``char-best``, gptlab's best small recipe.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from gptlab import configs
from gptlab.errors import GptlabError
from gptlab.model import GPTConfig
from gptlab.model.attention import ATTENTION_PATHS
from gptlab.model.loss import HEAD_LOSSES

DTYPES = ("auto", "float32", "bfloat16", "float16")
LOSS_IMPLS = (
    "auto",
    *HEAD_LOSSES,
)  # loss_impl: how the head and the loss are computed (gptlab.train.precision)
DEFAULT_PRESET = "char-tiny"
DEFAULT_RECIPE = "char-best"  # what `gptlab train` trains without --config
FINETUNE_RECIPE = "finetune"  # ... and what it trains from pretrained weights (init=SRC)


@dataclass
class TrainConfig:
    """Settings of ``gptlab train``; the defaults are the reference character-level run."""

    max_steps: int = 2000
    batch_size: int = 12  # sequences per micro-batch per process
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3  # peak learning rate of AdamW
    min_lr: float = 1e-4  # floor reached at max_steps
    warmup_steps: int = 100
    schedule: str = "cosine"  # cosine | linear (warm-down) | constant
    warmdown_steps: int = 0  # length of the linear warm-down (schedule = "linear")
    weight_decay: float = 0.1  # AdamW decay on matrices only
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    optimizer: str = "adamw"  # adamw | muon (Muon for the blocks' matrices, AdamW for the rest)
    muon_lr: float = 0.02
    muon_momentum: float = 0.95
    muon_weight_decay: float = 0.0
    eval_every: int = 250  # steps between evaluations (and loss.png refreshes)
    eval_batches: int = 20  # batches per split per evaluation
    ckpt_every: int = 500  # steps between checkpoints (one is always written at the end)
    keep_last: int = 2  # checkpoints kept besides the best by val loss
    seed: int = 1337
    dtype: str = "auto"  # auto (gptlab.hardware) | float32 | bfloat16 (autocast) | float16 (CUDA, GradScaler)
    compile: bool | str = False  # torch.compile the model; auto: where it pays (gptlab.hardware)
    loss_impl: str = "auto"  # auto | plain (whole logits) | chunked (head + loss over row chunks, gptlab.model.chunked_loss)
    # layer groups (mlp, attn, head, all) whose training products run in FP8 (gptlab.model.fp8, CUDA ≥ 8.9)
    fp8: list[str] = field(default_factory=list)
    fp8_wgrad: str = "bf16"  # bf16 | fp8: the fp8 layers' weight-gradient product
    attention: str = (
        "auto"  # auto | sdpa (fused kernel) | plain (the written-out equation: faster for bf16 on CPU)
    )
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    threads: int = 0  # CPU threads per process; 0: the available cores divided among processes
    log_every: int = 1  # steps between metrics.jsonl records (each record reads the loss: a sync on GPU)
    loggers: list[str] = field(default_factory=list)  # "tensorboard", "wandb"
    progress: bool = True  # the progress bar
    objective: str = "causal"  # causal (next token) | mlm (masked tokens, an encoder) | seq2seq (pairs) | dpo
    mlm_rate: float = (
        0.15  # objective = "mlm": share of positions chosen (80 % [MASK], 10 % random, 10 % kept)
    )
    beta: float = 0.1  # objective = "dpo": β, how far the policy may move from the reference
    label_smoothing: float = 0.0  # objective = "dpo": ε, the share of preference labels taken as flipped
    strategy: str = "ddp"  # ddp | fsdp (under torchrun: FSDP2 shards weights, gradients and AdamW state)
    activation_checkpointing: str = "none"  # none | blocks (recompute each block in the backward)
    reshard_after_forward: bool = True  # fsdp: free gathered weights after each block's forward
    model: dict[str, Any] = field(default_factory=dict)  # GPTConfig fields; "preset" picks the base
    init: str = ""  # start from pretrained weights: a gptlab checkpoint/run, a HF folder or a GGUF file
    finetune: str = "full"  # full | lora (gptlab.train.init.FINETUNE)
    lora_rank: int = 8  # r
    lora_alpha: float = 16.0  # α: the adapters add (α/r)·B·A·x
    lora_dropout: float = 0.0
    lora_targets: list[str] = field(default_factory=lambda: ["qkv", "attn.proj"])  # layer names
    lora_base: str = "float32"  # float32 | bfloat16 | int8: how the frozen base is held
    lora_lr_ratio: float = 1.0  # LoRA+: the adapters' B learn at lora_lr_ratio·lr, A at lr
    # objective = "grpo" (gptlab.train.reinforce): reinforcement from a reward function
    reward: str = ""  # "path/to/file.py:function", a Python function (prompt, completion[, example]) → float
    group_size: int = 4  # G: completions sampled per prompt (the group whose mean is the baseline)
    kl_coef: float = 0.0  # KL penalty weight; reference: LoRA with adapters off, full: a frozen copy
    rl_max_new_tokens: int = 64  # longest completion sampled
    rl_temperature: float = 1.0  # sampling temperature of the completions
    advantage_std: bool = True  # divide each advantage by its group's standard deviation (+ 1e-4)

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        from gptlab.train.optim import OPTIMIZERS
        from gptlab.train.schedule import SCHEDULES

        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise GptlabError(f"invalid train config: {msg}")

        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int":
                need(
                    isinstance(value, int) and not isinstance(value, bool),
                    f"{f.name} must be an integer, got {value!r}",
                )
            elif f.type == "float":
                need(
                    isinstance(value, int | float) and not isinstance(value, bool),
                    f"{f.name} must be a number, got {value!r}",
                )
                setattr(self, f.name, float(value))
            elif f.type == "bool":
                need(isinstance(value, bool), f"{f.name} must be true or false, got {value!r}")
            elif f.type == "str":
                need(isinstance(value, str), f"{f.name} must be a string, got {value!r}")
        for name in (
            "max_steps",
            "batch_size",
            "grad_accum",
            "eval_every",
            "eval_batches",
            "ckpt_every",
            "keep_last",
            "log_every",
        ):
            need(getattr(self, name) >= 1, f"{name} must be at least 1, got {getattr(self, name)}")
        for name in ("warmup_steps", "warmdown_steps", "threads"):
            need(getattr(self, name) >= 0, f"{name} must be ≥ 0, got {getattr(self, name)}")
        need(
            self.lr > 0 and self.min_lr >= 0,
            f"lr must be > 0 and min_lr ≥ 0, got lr={self.lr}, min_lr={self.min_lr}",
        )
        need(self.weight_decay >= 0 and self.grad_clip >= 0, "weight_decay and grad_clip must be ≥ 0")
        need(
            0 <= self.beta1 < 1 and 0 <= self.beta2 < 1,
            f"beta1, beta2 must be in [0, 1), got {self.beta1}, {self.beta2}",
        )
        need(
            self.schedule in SCHEDULES,
            f"schedule must be one of {', '.join(SCHEDULES)}; got {self.schedule!r}",
        )
        need(
            self.optimizer in OPTIMIZERS,
            f"optimizer must be one of {', '.join(OPTIMIZERS)}; got {self.optimizer!r}",
        )
        from gptlab.train.objectives import OBJECTIVES

        need(
            self.objective in OBJECTIVES,
            f"objective must be one of {', '.join(OBJECTIVES)}; got {self.objective!r}",
        )
        need(0.0 < self.mlm_rate < 1.0, f"mlm_rate must be in (0, 1), got {self.mlm_rate}")
        need(self.beta > 0, f"beta must be positive (DPO's β, e.g. 0.1), got {self.beta}")
        need(
            0.0 <= self.label_smoothing < 0.5,
            f"label_smoothing must be in [0, 0.5) (0: trust every preference), got {self.label_smoothing}",
        )
        from gptlab.train.reinforce import check_settings as check_reinforce

        check_reinforce(self, need)

        from gptlab.train.checkpointing import ACTIVATION_CHECKPOINTING
        from gptlab.train.strategy import STRATEGIES

        for name, table in (("strategy", STRATEGIES), ("activation_checkpointing", ACTIVATION_CHECKPOINTING)):
            need(
                getattr(self, name) in table,
                f"{name} must be one of {', '.join(table)}; got {getattr(self, name)!r}",
            )
        need(
            isinstance(self.compile, bool) or self.compile == "auto",
            f"compile must be true, false or auto; got {self.compile!r}",
        )
        need(self.dtype in DTYPES, f"dtype must be one of {', '.join(DTYPES)}; got {self.dtype!r}")
        need(
            self.attention in ("auto", *ATTENTION_PATHS),
            f"attention must be one of auto, {', '.join(ATTENTION_PATHS)}; got {self.attention!r}",
        )
        need(
            self.loss_impl in LOSS_IMPLS,
            f"loss_impl must be one of {', '.join(LOSS_IMPLS)}; got {self.loss_impl!r}",
        )
        from gptlab.model.fp8 import FP8_CHOICES, WGRAD

        need(
            isinstance(self.fp8, list) and all(g in FP8_CHOICES for g in self.fp8),
            f"fp8 must be a list of layer groups from {', '.join(FP8_CHOICES)} "
            f'(e.g. ["mlp", "head"]), got {self.fp8!r}',
        )
        need(self.fp8_wgrad in WGRAD, f"fp8_wgrad must be one of {', '.join(WGRAD)}; got {self.fp8_wgrad!r}")
        need(
            isinstance(self.loggers, list) and all(x in ("tensorboard", "wandb") for x in self.loggers),
            f'loggers must be a list of "tensorboard" and/or "wandb", got {self.loggers!r}',
        )
        need(isinstance(self.model, dict), f"model must be a table of GPTConfig fields, got {self.model!r}")
        from gptlab.train.init import check_settings

        check_settings(self, need)
        known = {f.name for f in dataclasses.fields(GPTConfig)} | {"preset"}
        unknown = sorted(set(self.model) - known)
        need(
            not unknown,
            f"unknown model key(s) {', '.join(unknown)}; valid model keys: {', '.join(sorted(known))}",
        )

    # ------------------------------------------------------------------- model
    def model_config(self, vocab_size: int) -> GPTConfig:
        """The ``GPTConfig`` of this run: the base preset, the ``model`` table, and the dataset's vocabulary."""
        fields = dict(self.model)
        preset = fields.pop("preset", DEFAULT_PRESET)
        given = fields.pop("vocab_size", None)
        if given is not None and given < vocab_size:
            raise GptlabError(
                f"model.vocab_size={given} is smaller than the dataset's vocabulary ({vocab_size}); "
                f"remove it or make it ≥ {vocab_size}"
            )
        return GPTConfig.preset(preset, vocab_size=given or vocab_size, **fields)

    # -------------------------------------------------------------------- dict
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TrainConfig:
        return configs.from_dict(cls, data, "config", hint=" (and model.<GPTConfig field>)")


def recipe_names() -> list[str]:
    return sorted(
        p.name[:-5]
        for p in (resources.files("gptlab.train") / "recipes").iterdir()
        if p.name.endswith(".toml")
    )


def read_config_file(name: str) -> dict[str, Any]:
    """A TOML file, or a built-in recipe by name, as a dict."""
    path = Path(name)
    if path.is_file():
        data = path.read_bytes()
        source = str(path)
    else:
        recipe = resources.files("gptlab.train") / "recipes" / f"{name}.toml"
        if not recipe.is_file():
            raise GptlabError(
                f"{name}: no such config file or built-in recipe; recipes: {', '.join(recipe_names())}"
            )
        data = recipe.read_bytes()
        source = f"recipe {name}"
    try:
        return tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GptlabError(f"{source}: not valid TOML: {exc}") from None


def parse_override(item: str) -> tuple[list[str], Any]:
    """``"model.n_layer=6"`` → ``(["model", "n_layer"], 6)``; the value is TOML, else a plain string."""
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise GptlabError(f"override {item!r} is not key=value (e.g. lr=3e-3 or model.n_layer=6)")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()
    return key.split("."), value


def merge(base: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in update.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def build_config(
    config: str | None = None, overrides: list[str] | tuple[str, ...] = (), base: dict[str, Any] | None = None
) -> TrainConfig:
    """``base`` (e.g. a resumed run's settings), then the config file / recipe, then ``key=value`` overrides."""
    data: dict[str, Any] = dict(base or {})
    if config:
        data = merge(data, read_config_file(config))
    for item in overrides:
        path, value = parse_override(item)
        if len(path) > 2 or (len(path) == 2 and path[0] != "model"):
            raise GptlabError(f"override {item!r}: only model.<field> keys are nested")
        data = merge(data, {path[0]: {path[1]: value}} if len(path) == 2 else {path[0]: value})
    return TrainConfig.from_dict(data)


def config_changes(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    """Settings that differ between two ``TrainConfig.to_dict()``: ``["lr 0.001 → 0.003", ...]``."""
    changes = []
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            changes += config_changes(a, b, f"{prefix}{key}.")
        elif a != b:
            changes.append(f"{prefix}{key} {a!r} → {b!r}")
    return changes
