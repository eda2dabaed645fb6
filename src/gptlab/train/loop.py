"""The training loop: minimise the cross-entropy of eq. 10 with AdamW (blueprint §3).

    L(θ) = −(1/BT)·Σ_b Σ_t log P_θ(x_t | x_<t)      per micro-batch; averaged over A micro-batches
    g = (1/A)·Σ_a ∇L_a(θ),  clipped to ‖g‖ ≤ c          one micro-batch of 2B = two of B
    θ ← AdamW(θ, g, η_t)                               η_t from ``gptlab.train.schedule``

``train(cfg, data_dir, run_dir)`` owns the optimizer, schedule, mixed precision,
accumulation, evaluation, records, checkpoint cadence and DDP. Resuming loads the
weights, optimizer and RNG states and the step (which is the data position, see
``gptlab.data.WindowSampler``), so on CPU a resumed run is bitwise the uninterrupted one.

A step reads nothing back on the host (no ``.item()``, no branch on a tensor), so a GPU never
waits for Python between steps: the loss is summed on the device, the gradient norm and the
clipping factor stay tensors, and the losses, norms and the nan/inf check are read once per
``log_every`` steps (``_log_steps``), as is the stop request under torchrun.

An objective may report more per step: ``step_metrics() -> {name: float or 0-d tensor}``, called
once per optimizer step and read with the loss; each key goes into ``metrics.jsonl``, the progress
line and a panel of ``loss.png``. ``per_token = False``: an evaluation per example (DPO's per pair),
no perplexity nor bits per byte; ``eval_metrics()`` adds sums over it (``val_<name>`` = sum / count).
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gptlab import checkpoint as ckpt
from gptlab.checkpoint import BEST_FILE, RUN_CONFIG_FILE, read_run_config, sharded
from gptlab.checkpoint.run import io_stop
from gptlab.compiling import probe_cpu_isa_early
from gptlab.errors import GptlabError
from gptlab.evaluate.loss import EvalResult
from gptlab.fileio import atomic_write_json
from gptlab.inspect.flops import peak_flops, training_flops_per_token
from gptlab.model import build_model
from gptlab.model.fp8 import enable_fp8
from gptlab.train import distributed, init
from gptlab.train.config import TrainConfig
from gptlab.train.metrics import MetricsLog, Pending, Progress, read_pending
from gptlab.train.objectives import make_objective
from gptlab.train.optim import build_optimizer
from gptlab.train.precision import announce, device_memory, loss_impl
from gptlab.train.precision import resolve as resolve_precision
from gptlab.train.resume import load_latest
from gptlab.train.runs import resolve_run
from gptlab.train.runtime import (
    StopFlag,
    autocast,
    compile_caches,
    compile_forward,
    rng_state,
    threads,
)
from gptlab.train.schedule import learning_rate
from gptlab.train.strategy import prepare_model, total_norm

#: I/O errors that stop a run with one line (a full disk, a quota, a file-size limit, a read-only disk, permissions)
WRITE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM}


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


# ---------------------------------------------------------------- training
def train(
    cfg: TrainConfig, data_dir: str | os.PathLike[str], run_dir: str | os.PathLike[str], resume: bool = False
) -> TrainResult:
    """Train a GPT on a prepared dataset, writing checkpoints and records to ``run_dir``.

    A new run that fails while starting (a missing logger package, a dataset too small) leaves
    no half run directory behind.
    """
    info = distributed.setup(cfg.device)
    run_dir = Path(run_dir)
    existed = run_dir.exists()
    try:
        try:
            trainer = _Trainer(cfg, Path(data_dir), run_dir, resume, info)
        except BaseException:
            if info.is_main and not resume:
                ckpt.discard_failed_start(run_dir, existed)
            raise
        try:
            return trainer.run()
        except OSError as exc:  # a full disk while writing metrics, a plot or best.json: one line
            if exc.errno not in WRITE_ERRNOS:
                raise
            raise io_stop(exc, run_dir, f"cannot write {exc.filename or run_dir}") from None
    finally:
        distributed.teardown(info)


class _Trainer:
    def __init__(
        self, cfg: TrainConfig, data_dir: Path, run_dir: Path, resume: bool, info: distributed.DistInfo
    ) -> None:
        torch.set_num_threads(threads(cfg, info.world_size))
        self.objective = make_objective(cfg, data_dir, info.rank, info.world_size)  # batches and loss
        self.data, self.model_config = self.objective.data, self.objective.model_config
        # what dtype/attention/compile "auto" mean on this device, for this model's context
        cfg, self.resolved = resolve_precision(cfg, info.device, self.model_config.block_size)
        self.cfg, self.run_dir, self.info, self.data_dir = cfg, run_dir, info, data_dir
        self.device = info.device
        self.device_type = torch.device(self.device).type
        if cfg.compile:  # inductor's ISA probe (~1 s) runs while the model is built and traced
            probe_cpu_isa_early(self.device_type)
        self.start = self.objective.start  # pretrained weights to fine-tune (init=SRC), or None
        ckpt.check_tokenizer_fits(
            self.objective.tokenizer, self.model_config.vocab_size, data_dir / "tokenizer.json"
        )
        T = self.model_config.block_size
        if self.start is not None and self.start.shortened:  # said with the hardware line
            self.resolved["context"] = {"block_size": T, "pretrained": self.start.shortened}
        self.autocast = autocast(self.device_type, cfg.dtype)
        self.tokens_per_step = cfg.batch_size * T * cfg.grad_accum * info.world_size

        torch.manual_seed(cfg.seed)  # the same initial weights on every rank
        model = init.finetune_model(self.start, cfg) if self.start else build_model(self.model_config)
        impl = loss_impl(cfg, self.model_config, device_memory(self.device))  # plain | chunked head + loss
        self.resolved["loss_impl"] = impl
        # the step needs the loss alone: a compiled graph then need not output (B, T, V) logits
        self.model = model.set_attention_impl(cfg.attention).set_loss_impl(impl, keep_logits=False)
        self.model = self.model.to(self.device)
        enable_fp8(self.model, cfg.fp8, self.device, wgrad=cfg.fp8_wgrad)  # FP8 products (CUDA ≥ 8.9)
        self.strategy, self.forward = prepare_model(self.model, cfg, info)  # DDP/FSDP, checkpointing
        self.optimizer = build_optimizer(self.model, cfg, self.device_type)
        self.scaler = torch.amp.GradScaler("cuda") if cfg.dtype == "float16" else None
        self.step = 0
        self.best: dict[str, Any] = {"val_loss": None, "step": None}
        self.train_wall_s = 0.0
        resume_step = self._load_latest() if resume else None
        if resume_step is None:
            torch.manual_seed(cfg.seed + info.rank)  # dropout differs across ranks
        if info.is_main:
            # the loggers first: a missing package must fail before anything is written
            self.log = MetricsLog(run_dir, resume_step if resume else None, cfg.loggers, cfg.to_dict())
            ckpt.clean_incomplete(run_dir)
            ckpt.write_run_config(
                run_dir,
                {
                    "train": cfg.to_dict(),
                    "model": self.model_config.to_dict(),
                    "data": str(data_dir.resolve()),
                    "data_fingerprint": self.data.fingerprint,
                    "resolved": self.resolved,
                },
            )
            announce(self.resolved)
        self.caching: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
        if cfg.compile:
            self.forward = compile_forward(self.forward, self.device_type)
            self.caching = compile_caches

    # ------------------------------------------------------------- resume
    def _load_latest(self) -> int | None:
        """The newest checkpoint that verifies (``gptlab.train.resume``): state restored, step returned."""
        resumed = load_latest(self)
        if resumed is None:
            return None
        self.step = resumed.step
        self.best = resumed.meta.get("best", self.best)
        self.train_wall_s = float(resumed.meta.get("train_wall_s", 0.0))
        return self.step

    def save(self, val_loss: float | None) -> Path | None:
        """Write ``ckpt-<step>`` (main process; every rank under FSDP), prune old ones, keep the best."""
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
                self.run_dir,
                self.step,
                self.model,
                self.optimizer,
                self.objective.tokenizer,
                self.info,
                extra,
            )
        elif self.info.is_main:
            state: dict[str, Any] = {
                "optimizer": self.optimizer.state_dict(),
                "rng": rng_state(self.device_type),
            }
            if self.scaler is not None:
                state["scaler"] = self.scaler.state_dict()
            path = ckpt.save_training_checkpoint(
                self.run_dir, self.step, self.model, self.objective.tokenizer, state, extra=extra
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
        """Loss, perplexity and bits per byte on ``eval_batches`` global batches of each split."""
        out: dict[str, float] = {}
        for split in ("train", "val"):  # eval_batches counts global batches (B per rank), shared out by rank
            with self.strategy.gathered(self.model):  # FSDP: whole weights, so ranks may differ in batches
                total, count = self.objective.eval_sum(
                    self.model, split, self.cfg.eval_batches, self.device, self.autocast
                )
            sums = distributed.all_reduce_sum(
                torch.stack([total, torch.tensor(float(count), dtype=torch.float64, device=self.device)]),
                self.info,
            )
            extra = self._eval_metrics()
            if getattr(self.objective, "per_token", True):
                result = EvalResult(float(sums[0] / sums[1]), int(sums[1]), self.data.bytes_per_token(split))
                out.update(result.to_dict(f"{split}_"))
            else:  # a loss per example (a pair, a prompt): no perplexity, no bits per byte
                out.update({f"{split}_loss": float(sums[0] / sums[1]), f"{split}_examples": int(sums[1])})
            out.update({f"{split}_{k}": v / max(float(sums[1]), 1.0) for k, v in extra.items()})
        return out

    def _eval_metrics(self) -> dict[str, float]:
        """The objective's ``eval_metrics()``: sums over the evaluation just run, summed over ranks."""
        sums: dict[str, torch.Tensor] = getattr(self.objective, "eval_metrics", dict)()
        if not sums:
            return {}
        stacked = torch.stack([v.double().reshape(()) for v in sums.values()])
        return dict(zip(sums, distributed.all_reduce_sum(stacked, self.info).tolist(), strict=True))

    # ------------------------------------------------------------- one step
    def train_step(self) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step over ``grad_accum`` micro-batches; returns (mean loss, gradient norm)."""
        cfg = self.cfg
        self.optimizer.set_lr_scale(learning_rate(self.step, cfg) / cfg.lr)
        total = torch.zeros((), device=self.device)
        for micro in range(cfg.grad_accum):
            batch = self.objective.batch(self.step, micro, self.device)
            skip_sync = self.info.enabled and micro < cfg.grad_accum - 1
            with self.strategy.no_sync(self.forward, skip_sync), self.autocast, self.caching():
                loss = self.objective.loss(self.forward, batch) / cfg.grad_accum
            (self.scaler.scale(loss) if self.scaler else loss).backward()
            total += loss.detach()
        if self.scaler is not None:
            for opt in self.optimizer.optimizers.values():
                self.scaler.unscale_(opt)
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = total_norm([p.grad for p in params if p.grad is not None])
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
        """Step until ``max_steps`` or a stop request; log, evaluate and save at their cadences."""
        cfg, main = self.cfg, self.info.is_main
        peak = peak_flops(self.device, cfg.dtype)
        progress = Progress(
            cfg.max_steps,
            self.step,
            cfg.progress and main,
            self.tokens_per_step,
            training_flops_per_token(self.model_config),
            peak,
            self.info.world_size,
        )
        pending: Pending = []
        shown: dict[str, float] = {}  # the objective's metrics of the last step read
        window, step_s = (0.0, 0), 0.0  # (seconds, steps) since the losses were last read; mean step time
        train_loss = val_loss = None
        checkpoint, interrupted = None, False
        self.model.train()
        try:
            with StopFlag() as stop:
                while self.step < cfg.max_steps:
                    t0 = time.perf_counter()
                    loss, norm = self.train_step()
                    extra: dict[str, torch.Tensor | float] = getattr(self.objective, "step_metrics", dict)()
                    pending.append((self.step, loss, norm, learning_rate(self.step - 1, cfg), extra))
                    at_eval = self.step % cfg.eval_every == 0 or self.step == cfg.max_steps
                    at_ckpt = self.step % cfg.ckpt_every == 0 or self.step == cfg.max_steps
                    at_log = at_eval or at_ckpt or self.step % cfg.log_every == 0
                    interrupted = self._stop_requested(stop.requested, at_log)
                    if at_log or interrupted:
                        train_loss, shown = self._log_steps(pending)  # reads the losses; raises on nan/inf
                    dt = time.perf_counter() - t0
                    self.train_wall_s += dt
                    window = (window[0] + dt, window[1] + 1)
                    if at_log or interrupted:  # a GPU's queue is drained only here: rate over the window
                        step_s, window = window[0] / window[1], (0.0, 0)
                    progress.step(train_loss, step_s or dt, force=at_eval, extra=shown)
                    if at_eval:
                        val_loss = self._evaluate_step(progress)
                    if at_ckpt or interrupted:
                        checkpoint = self.save(val_loss if at_eval else None)
                        distributed.barrier(self.info)
                    if interrupted:
                        break
        finally:
            progress.close()
            if main:
                self.log.close()
        return TrainResult(
            run_dir=self.run_dir,
            step=self.step,
            train_loss=train_loss,
            val_loss=val_loss,
            best_val_loss=self.best["val_loss"],
            best_step=self.best["step"],
            tokens=self.step * self.tokens_per_step,
            train_wall_s=self.train_wall_s,
            checkpoint=checkpoint,
            interrupted=interrupted,
        )

    def _stop_requested(self, requested: bool, at_log: bool) -> bool:
        """Stop now? One process: at once. Under torchrun the ranks agree through a collective,
        which reads a value on the host (a sync), so only at log steps."""
        if not self.info.enabled:
            return requested
        return at_log and distributed.any_flag(requested, self.info)

    def _evaluate_step(self, progress: Progress) -> float:
        """Evaluate; the main process records it, redraws loss.png and prints a line. Returns val loss."""
        record = {"step": self.step, "tokens": self.step * self.tokens_per_step, **self.evaluate()}
        if self.info.is_main:
            self.log.log(record)
            self.log.plot(self.tokens_per_step)
            figures = [f"train loss {record['train_loss']:.4f}", f"val loss {record['val_loss']:.4f}"]
            skip = ("val_loss", "val_ppl", "val_tokens", "val_examples")  # val bpb, and an objective's own
            figures += [
                f"val {k[4:]} {v:.3f}" for k, v in record.items() if k.startswith("val_") and k not in skip
            ]
            progress.write(f"step {self.step}: " + ", ".join(figures))
        return record["val_loss"]

    def _log_steps(self, pending: Pending) -> tuple[float, dict[str, float]]:
        """Read the pending losses and step metrics (one sync), stop on nan/inf, and append them to
        metrics.jsonl; returns the last step's loss and metrics."""
        for step, loss, norm, lr, metrics in read_pending(pending):
            self._check_finite(step, loss, norm)
            if self.info.is_main:
                record = {"step": step, "loss": loss, "grad_norm": norm, "lr": lr}
                self.log.log(
                    {
                        **record,
                        "tokens": step * self.tokens_per_step,
                        "time_s": round(self.train_wall_s, 4),
                        **metrics,
                    }
                )
        pending.clear()
        return loss, metrics

    def _check_finite(self, step: int, loss: float, norm: float) -> None:
        """A nan/inf loss (or gradient norm, without a loss scaler) stops the run, naming the last good checkpoint."""
        if math.isfinite(loss) and (math.isfinite(norm) or self.scaler is not None):
            return
        what, value = ("loss", loss) if not math.isfinite(loss) else ("gradient norm", norm)
        ckpts = ckpt.list_checkpoints(self.run_dir)
        kept = f"the last good checkpoint is {ckpts[-1][1]}" if ckpts else "no checkpoint was written yet"
        raise GptlabError(
            f"training diverged: the {what} is {value} at step {step}; "
            f"stopped ({kept}). Lower lr, keep grad_clip > 0, or use dtype=float32"
        )


__all__ = ["BEST_FILE", "RUN_CONFIG_FILE", "TrainResult", "read_run_config", "resolve_run", "train"]
