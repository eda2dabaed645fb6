"""The training loop: minimise the cross-entropy of eq. 10 with AdamW (blueprint §3).

    L(θ) = −(1/BT)·Σ_b Σ_t log P_θ(x_t | x_<t)      per micro-batch; averaged over A micro-batches
    g = (1/A)·Σ_a ∇L_a(θ),  clipped to ‖g‖ ≤ c          one micro-batch of 2B = two of B
    θ ← AdamW(θ, g, η_t)                               η_t from ``gptlab.train.schedule``

``train(cfg, data_dir, run_dir)`` owns the optimizer, schedule, mixed precision,
accumulation, evaluation, records, checkpoint cadence and DDP. Resuming loads the
weights, optimizer and RNG states and the step (which is the data position, see
``gptlab.data.WindowSampler``), so on CPU a resumed run is bitwise the uninterrupted one.
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import time
import warnings
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import torch

from gptlab import checkpoint as ckpt
from gptlab.checkpoint import sharded
from gptlab.compiling import can_compile
from gptlab.data import TokenDataset, WindowSampler, eval_batches, n_eval_batches
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json
from gptlab.model import GPT
from gptlab.train import distributed
from gptlab.train.config import TrainConfig, build_config
from gptlab.train.evaluate import EvalResult, loss_sum
from gptlab.train.metrics import MetricsLog
from gptlab.train.optim import build_optimizer
from gptlab.train.schedule import learning_rate
from gptlab.train.strategy import prepare_model, total_norm

RUN_CONFIG_FILE = "train_config.json"
BEST_FILE = "best.json"
AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
PEAK_FLOPS = {
    "H100": 989e12,
    "A100": 312e12,
    "L40": 181e12,
    "4090": 165e12,
    "A10": 125e12,
    "L4": 121e12,
    "V100": 125e12,
    "3090": 71e12,
    "T4": 65e12,
}  # dense bf16/fp16 tensor-core peaks


@dataclass
class TrainResult:
    run_dir: Path
    step: int
    train_loss: float | None
    val_loss: float | None
    best_val_loss: float | None
    best_step: int | None
    tokens: int
    train_wall_s: float
    checkpoint: Path | None
    interrupted: bool = False

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.train_wall_s if self.train_wall_s > 0 else 0.0


# ---------------------------------------------------------------- run directory
def read_run_config(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    path = Path(run_dir) / RUN_CONFIG_FILE
    return ckpt.read_json(path) if path.is_file() else None


def resolve_run(
    run_dir: str | os.PathLike[str],
    data_dir: str | os.PathLike[str] | None,
    resume: bool,
    config: str | None,
    overrides: list[str],
) -> tuple[TrainConfig, Path]:
    """The config and dataset of a new or resumed run (resumed: its saved settings, then config and overrides)."""
    run_dir = Path(run_dir)
    saved = read_run_config(run_dir) if run_dir.is_dir() else None
    if resume:
        if not run_dir.is_dir():
            raise GptlabError(f"{run_dir}: no such run directory to resume; drop --resume to start a new run")
        if saved is None and not ckpt.list_checkpoints(run_dir):
            raise GptlabError(
                f"{run_dir}: not a training run ({RUN_CONFIG_FILE} is missing); nothing to resume"
            )
        base = saved.get("train") if saved else None
        data = data_dir or (saved or {}).get("data")
        if data is None:
            raise GptlabError(f"{run_dir}: the dataset of this run is not recorded; give --data")
        return build_config(config, overrides, base=base), Path(data)
    if run_dir.exists() and (saved is not None or ckpt.list_checkpoints(run_dir)):
        raise GptlabError(
            f"{run_dir}: already holds a training run; pass --resume to continue it, or choose another --out"
        )
    if data_dir is None:
        raise GptlabError("--data DATA_DIR is required (make one with `gptlab prepare`)")
    return build_config(config, overrides), Path(data_dir)


# ---------------------------------------------------------------- helpers
def _autocast(device_type: str, dtype: str) -> contextlib.AbstractContextManager[Any]:
    if dtype == "float32":
        return contextlib.nullcontext()
    if dtype == "float16" and device_type != "cuda":
        raise GptlabError(
            "dtype=float16 needs a CUDA device (it uses a gradient scaler); use dtype=bfloat16 on CPU"
        )
    return torch.autocast(device_type=device_type, dtype=AUTOCAST_DTYPES[dtype])


def compile_forward(forward: Any, device_type: str) -> Any:
    """``torch.compile`` the training forward (the model, or its DDP wrapper), or return it unchanged.

    The whole model is one graph: the forward and backward each run as a handful of fused
    kernels around the matrix products (a step of the reference recipe: 27 ms compiled, 33 ms
    eager; compiling block by block costs half the cold compile but runs ~10 % slower).
    Checkpoints save the uncompiled model, so parameter names do not change. On a CPU,
    inductor needs a C++ compiler; without one the run warns and trains uncompiled.
    """
    if not can_compile(device_type):
        warnings.warn(
            "compile=true needs a C++ compiler on CPU (none found: install g++ or set CXX); "
            "training uncompiled",
            stacklevel=2,
        )
        return forward
    return torch.compile(forward)


def _rng_state(device_type: str) -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if device_type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, torch.Tensor], device_type: str) -> None:
    torch.set_rng_state(state["torch"])
    if device_type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def _threads(cfg: TrainConfig, world: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return cfg.threads or max(1, cores // world)


def _flops_per_token(model: GPT) -> float:
    """≈ 6·N + 12·L·T·d (weights, forward and backward, plus attention scores)."""
    c = model.config
    n = model.num_params()["total_without_positions"]
    return 6 * n + 12 * c.n_layer * c.block_size * c.n_embd


def _peak_flops(device: str) -> float | None:
    if not device.startswith("cuda"):
        return None
    name = torch.cuda.get_device_name(torch.device(device))
    return next((v for k, v in PEAK_FLOPS.items() if k in name), None)


class _StopFlag:
    """Ctrl-C (SIGINT) or SIGTERM asks the loop to save and stop after the current step; a second Ctrl-C aborts."""

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> _StopFlag:
        with contextlib.suppress(ValueError):  # not the main thread: no handlers
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)


# ---------------------------------------------------------------- training
def train(
    cfg: TrainConfig, data_dir: str | os.PathLike[str], run_dir: str | os.PathLike[str], resume: bool = False
) -> TrainResult:
    """Train a GPT on a prepared dataset, writing checkpoints and records to ``run_dir``."""
    info = distributed.setup(cfg.device)
    try:
        return _Trainer(cfg, Path(data_dir), Path(run_dir), resume, info).run()
    finally:
        distributed.teardown(info)


class _Trainer:
    def __init__(
        self, cfg: TrainConfig, data_dir: Path, run_dir: Path, resume: bool, info: distributed.DistInfo
    ) -> None:
        self.cfg, self.run_dir, self.info = cfg, run_dir, info
        self.device = info.device
        self.device_type = torch.device(self.device).type
        torch.set_num_threads(_threads(cfg, info.world_size))
        self.data = TokenDataset(data_dir)
        self.data_dir = data_dir
        self.model_config = cfg.model_config(self.data.vocab_size)
        T = self.model_config.block_size
        self.sampler = WindowSampler(
            self.data.split("train"),
            T,
            cfg.batch_size,
            seed=cfg.seed,
            grad_accum=cfg.grad_accum,
            world_size=info.world_size,
            rank=info.rank,
        )
        self.data.split("val")
        self.autocast = _autocast(self.device_type, cfg.dtype)
        self.tokens_per_step = cfg.batch_size * T * cfg.grad_accum * info.world_size

        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        self.model = GPT(self.model_config).set_attention_impl(cfg.attention).to(self.device)
        self.strategy, self.forward = prepare_model(self.model, cfg, info)  # DDP/FSDP, checkpointing
        self.optimizer = build_optimizer(
            self.model,
            cfg.optimizer,
            cfg.lr,
            cfg.weight_decay,
            (cfg.beta1, cfg.beta2),
            self.device_type,
            cfg.muon_lr,
            cfg.muon_momentum,
            cfg.muon_weight_decay,
        )
        self.scaler = torch.amp.GradScaler("cuda") if cfg.dtype == "float16" else None
        self.step = 0
        self.best: dict[str, Any] = {"val_loss": None, "step": None}
        self.train_wall_s = 0.0
        resume_step = self._load_latest() if resume else None
        if resume_step is None:
            torch.manual_seed(cfg.seed + info.rank)  # dropout differs across ranks
        if info.is_main:
            run_dir.mkdir(parents=True, exist_ok=True)
            ckpt.clean_incomplete(run_dir)
            atomic_write_json(
                run_dir / RUN_CONFIG_FILE,
                {
                    "train": cfg.to_dict(),
                    "model": self.model_config.to_dict(),
                    "data": str(data_dir.resolve()),
                    "data_fingerprint": self.data.fingerprint,
                },
            )
            self.log = MetricsLog(run_dir, resume_step if resume else None, cfg.loggers, cfg.to_dict())
        if cfg.compile:
            self.forward = compile_forward(self.forward, self.device_type)
        self.flops_per_token = _flops_per_token(self.model)
        self.peak_flops = _peak_flops(self.device)

    # ------------------------------------------------------------- resume
    def _load_latest(self) -> int | None:
        ckpts = ckpt.list_checkpoints(self.run_dir)
        if not ckpts:
            return None
        step, path = ckpts[-1]
        is_sharded = sharded.is_sharded(path)
        state, meta = ({}, sharded.read_info(path)) if is_sharded else ckpt.read_training_checkpoint(path)
        if meta.get("data_fingerprint") not in (None, self.data.fingerprint):
            raise GptlabError(
                f"{path} was trained on a different dataset than {self.data_dir}; "
                f"resume with the run's own --data"
            )
        config = ckpt.read_config(path / ckpt.CONFIG_FILE)
        if config.to_dict() != self.model_config.to_dict():
            raise GptlabError(
                f"{path}: the model settings differ from this run's; model.* overrides cannot change "
                f"when resuming"
            )
        if is_sharded:  # every rank reads its shards (any number of ranks) and its own RNG
            sharded.load_training_state(path, self.model, self.optimizer, self.info, self.cfg.seed + step)
        else:
            ckpt.load_model_state(self.model, ckpt.read_tensors(path / ckpt.WEIGHTS_FILE), path)
            self.optimizer.load_state_dict(state["optimizer"])
            if self.scaler is not None and "scaler" in state:
                self.scaler.load_state_dict(state["scaler"])
            if self.info.is_main:
                _set_rng_state(state["rng"], self.device_type)
            else:
                torch.manual_seed(self.cfg.seed + self.info.rank + step)
        self.step = int(meta["step"])
        self.best = meta.get("best", self.best)
        self.train_wall_s = float(meta.get("train_wall_s", 0.0))
        return self.step

    def _save(self, val_loss: float | None) -> Path | None:
        if val_loss is not None and (self.best["val_loss"] is None or val_loss < self.best["val_loss"]):
            self.best = {"val_loss": val_loss, "step": self.step}
        extra = {
            "val_loss": val_loss,
            "best": self.best,
            "train_wall_s": self.train_wall_s,
            "tokens": self.step * self.tokens_per_step,
            "data_fingerprint": self.data.fingerprint,
        }
        if self.strategy.sharded:  # every rank writes its own shard (DCP)
            path = sharded.save_training_checkpoint(
                self.run_dir, self.step, self.model, self.optimizer, self.data.tokenizer, self.info, extra
            )
        elif self.info.is_main:
            state: dict[str, Any] = {
                "optimizer": self.optimizer.state_dict(),
                "rng": _rng_state(self.device_type),
            }
            if self.scaler is not None:
                state["scaler"] = self.scaler.state_dict()
            path = ckpt.save_training_checkpoint(
                self.run_dir, self.step, self.model, self.data.tokenizer, state, extra=extra
            )
        if not self.info.is_main:
            return None
        protect = {self.best["step"]} if self.best["step"] is not None else set()
        ckpt.prune_checkpoints(self.run_dir, self.cfg.keep_last, protect)
        if self.best["step"] is not None:
            atomic_write_json(
                self.run_dir / BEST_FILE, {**self.best, "checkpoint": f"ckpt-{self.best['step']}"}
            )
        return path

    # ------------------------------------------------------------- eval
    def evaluate(self) -> dict[str, float]:
        out: dict[str, float] = {}
        T, B, n = self.model_config.block_size, self.cfg.batch_size, self.cfg.eval_batches
        for split in ("train", "val"):
            world = (
                self.info.world_size
            )  # eval_batches counts global batches (B per rank), shared out by rank
            k = n_eval_batches(len(self.data.split(split)), T, B, n * world)
            stop = k - k % world if self.strategy.sharded else None  # FSDP: equal batches on every rank
            batches = islice(
                eval_batches(self.data.split(split), T, B, n * world), self.info.rank, stop, world
            )
            with self.strategy.gathered(self.model):
                total, count = loss_sum(self.model, batches, self.device, self.autocast)
            sums = distributed.all_reduce_sum(
                torch.stack([total, torch.tensor(float(count), dtype=torch.float64, device=self.device)]),
                self.info,
            )
            result = EvalResult(float(sums[0] / sums[1]), int(sums[1]), self.data.bytes_per_token(split))
            out.update(result.to_dict(f"{split}_"))
        return out

    # ------------------------------------------------------------- one step
    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over ``grad_accum`` micro-batches; returns (mean loss, gradient norm)."""
        cfg = self.cfg
        self.optimizer.set_lr_scale(
            learning_rate(
                self.step,
                cfg.schedule,
                cfg.lr,
                cfg.min_lr,
                cfg.warmup_steps,
                cfg.max_steps,
                cfg.warmdown_steps,
            )
            / cfg.lr
        )
        total = torch.zeros((), device=self.device)
        for micro in range(cfg.grad_accum):
            x, y = self.sampler.batch(self.step, micro)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            skip_sync = self.info.enabled and micro < cfg.grad_accum - 1
            with self.strategy.no_sync(self.forward, skip_sync), self.autocast:
                _, loss = self.forward(x, y)
                loss = loss / cfg.grad_accum
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += loss.detach()
        if self.scaler is not None:
            for opt in self.optimizer.optimizers.values():
                self.scaler.unscale_(opt)
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = total_norm([p.grad for p in params])
        grad_scale = None
        if cfg.grad_clip > 0:  # g ← g·min(1, c/(‖g‖ + 10⁻⁶)), as clip_grad_norm_
            if self.scaler is None and self.optimizer.takes_grad_scale:  # inside the fused update
                grad_scale = ((norm + 1e-6) / cfg.grad_clip).clamp(min=1.0)
            else:
                torch.nn.utils.clip_grads_with_norm_(params, cfg.grad_clip, norm)
        if self.scaler is not None:
            for opt in self.optimizer.optimizers.values():
                self.scaler.step(opt)
            self.scaler.update()
        else:
            self.optimizer.step(grad_scale)
        self.optimizer.zero_grad()
        self.step += 1
        return total, norm

    # ------------------------------------------------------------- the loop
    def run(self) -> TrainResult:
        from tqdm import tqdm

        cfg, main = self.cfg, self.info.is_main
        last_ckpt: Path | None = None
        last_val: float | None = None
        train_loss: float | None = None
        pending: list[tuple[int, torch.Tensor, torch.Tensor, float]] = []
        bar = tqdm(
            total=cfg.max_steps,
            initial=self.step,
            disable=not (cfg.progress and main),
            unit="step",
            dynamic_ncols=True,
            mininterval=0.5,
            smoothing=0.1,
        )
        last_postfix = 0.0
        interrupted = False
        self.model.train()
        try:
            with _StopFlag() as stop:
                while self.step < cfg.max_steps:
                    t0 = time.perf_counter()
                    loss, norm = self.train_step()
                    pending.append(
                        (
                            self.step,
                            loss,
                            norm,
                            learning_rate(
                                self.step - 1,
                                cfg.schedule,
                                cfg.lr,
                                cfg.min_lr,
                                cfg.warmup_steps,
                                cfg.max_steps,
                                cfg.warmdown_steps,
                            ),
                        )
                    )
                    at_eval = self.step % cfg.eval_every == 0 or self.step == cfg.max_steps
                    at_ckpt = self.step % cfg.ckpt_every == 0 or self.step == cfg.max_steps
                    stopping = distributed.any_flag(stop.requested, self.info)
                    flush = at_eval or at_ckpt or stopping or self.step % cfg.log_every == 0
                    if flush:
                        train_loss = self._flush(pending)  # reads the losses; raises on nan/inf
                    dt = time.perf_counter() - t0
                    self.train_wall_s += dt
                    bar.update(1)
                    now = time.monotonic()
                    if main and train_loss is not None and (now - last_postfix > 0.5 or flush and at_eval):
                        last_postfix = now
                        bar.set_postfix_str(self._postfix(train_loss, dt), refresh=False)
                    if at_eval:
                        record = {
                            "step": self.step,
                            "tokens": self.step * self.tokens_per_step,
                            **self.evaluate(),
                        }
                        last_val = record["val_loss"]
                        if main:
                            self.log.log(record)
                            self.log.plot(self.tokens_per_step)
                            bar.write(
                                f"step {self.step}: train loss {record['train_loss']:.4f}, "
                                f"val loss {last_val:.4f}, val bpb {record['val_bpb']:.3f}"
                            )
                    if at_ckpt or stopping:
                        last_ckpt = self._save(last_val if at_eval else None)
                        distributed.barrier(self.info)
                    if stopping:
                        interrupted = True
                        break
        finally:
            bar.close()
            if main:
                self.log.close()
        return TrainResult(
            run_dir=self.run_dir,
            step=self.step,
            train_loss=train_loss,
            val_loss=last_val,
            best_val_loss=self.best["val_loss"],
            best_step=self.best["step"],
            tokens=self.step * self.tokens_per_step,
            train_wall_s=self.train_wall_s,
            checkpoint=last_ckpt,
            interrupted=interrupted,
        )

    def _flush(self, pending: list[tuple[int, torch.Tensor, torch.Tensor, float]]) -> float:
        """Read the pending losses (one sync), stop on nan/inf, and append them to metrics.jsonl."""
        values = torch.stack(
            [torch.stack([loss.float(), norm.float()]) for _, loss, norm, _ in pending]
        ).tolist()
        loss = values[-1][0]
        for (step, _, _, lr), (lv, nv) in zip(pending, values):
            if not math.isfinite(lv) or (not math.isfinite(nv) and self.scaler is None):
                what = "loss" if not math.isfinite(lv) else "gradient norm"
                ckpts = ckpt.list_checkpoints(self.run_dir)
                kept = (
                    f"the last good checkpoint is {ckpts[-1][1]}"
                    if ckpts
                    else "no checkpoint was written yet"
                )
                raise GptlabError(
                    f"training diverged: the {what} is {lv if what == 'loss' else nv} at step {step}; "
                    f"stopped ({kept}). Lower lr, keep grad_clip > 0, or use dtype=float32"
                )
            if self.info.is_main:
                self.log.log(
                    {
                        "step": step,
                        "loss": lv,
                        "grad_norm": nv,
                        "lr": lr,
                        "tokens": step * self.tokens_per_step,
                        "time_s": round(self.train_wall_s, 4),
                    }
                )
        pending.clear()
        return loss

    def _postfix(self, loss: float, dt: float) -> str:
        tok_s = self.tokens_per_step / dt if dt > 0 else 0.0
        text = f"loss {loss:.4f} | {tok_s:,.0f} tok/s"
        if self.peak_flops:
            text += (
                f" | MFU {100 * self.flops_per_token * tok_s / (self.peak_flops * self.info.world_size):.1f}%"
            )
        return text
