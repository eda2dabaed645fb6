"""Training records: ``metrics.jsonl`` (one JSON object per line), ``loss.png``, optional
TensorBoard / Weights & Biases logging when those packages are installed, and the progress bar
(loss, tokens/s and MFU, ``gptlab.inspect.flops``).

An objective's own step metrics (``step_metrics()``, see ``gptlab.train.loop``) are drawn beside
the loss, one panel each; keys ``group/name`` share the panel ``group`` (DPO's ``reward/chosen``
and ``reward/rejected``), as TensorBoard groups them.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from gptlab.checkpoint.rundir import METRICS_FILE, read_metrics
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write, atomic_write_text

if TYPE_CHECKING:
    import torch

#: (step, loss, gradient norm, learning rate, the objective's step metrics) of steps not read yet
Pending = list[tuple[int, "torch.Tensor", "torch.Tensor", float, dict[str, "torch.Tensor | float"]]]

PLOT_FILE = "loss.png"
#: the keys every step record has (anything else is an objective's step metric)
STEP_KEYS = ("step", "loss", "grad_norm", "lr", "tokens", "time_s")


def read_pending(pending: Pending) -> list[tuple[int, float, float, float, dict[str, float]]]:
    """``(step, loss, grad norm, lr, metrics)`` of the pending steps, all read in one sync (a tensor
    metric is read with its loss)."""
    import torch

    rows = [
        torch.stack(
            [
                loss.float(),
                norm.float(),
                *(
                    torch.as_tensor(v, dtype=torch.float32, device=loss.device).reshape(())
                    for v in extra.values()
                ),
            ]
        )
        for _, loss, norm, _, extra in pending
    ]
    values = torch.cat(rows).tolist()
    out, at = [], 0
    for (step, _, _, lr, extra), row in zip(pending, rows, strict=True):
        loss, norm, *more = values[at : at + len(row)]
        at += len(row)
        out.append((step, loss, norm, lr, dict(zip(extra, more, strict=True))))
    return out


def step_metric_panels(records: list[dict[str, Any]]) -> dict[str, list[str]]:
    """``{panel: [keys]}`` of the objective's step metrics in ``records`` (``group/name`` → panel ``group``)."""
    panels: dict[str, list[str]] = {}
    for r in records:
        if "loss" not in r:
            continue
        for key, value in r.items():
            if key in STEP_KEYS or not isinstance(value, int | float):
                continue
            keys = panels.setdefault(key.split("/")[0], [])
            if key not in keys:
                keys.append(key)
    return panels


class MetricsLog:
    """Appends records to ``RUN_DIR/metrics.jsonl`` and keeps them for the plot."""

    def __init__(
        self,
        run_dir: str | os.PathLike[str],
        resume_step: int | None,
        loggers: list[str],
        config: dict[str, Any],
    ) -> None:
        self.path = Path(run_dir) / METRICS_FILE
        self.plot_path = Path(run_dir) / PLOT_FILE
        # a resumed run drops the records after its checkpoint (it will write them again)
        keep = resume_step or 0
        self.records = (
            [r for r in read_metrics(self.path) if r["step"] <= keep] if resume_step is not None else []
        )
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in self.records))
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 (kept open for the run)
        self.sinks = [SINKS[name](Path(run_dir), config) for name in loggers]

    def log(self, record: dict[str, Any]) -> None:
        self.records.append(record)
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()
        for sink in self.sinks:
            sink.log(record)

    def close(self) -> None:
        self._file.close()
        for sink in self.sinks:
            sink.close()

    def plot(self, tokens_per_step: int) -> Path:
        """Write ``loss.png``: train and val loss against steps (bottom axis) and tokens (top axis),
        and beside it a panel per group of the objective's step metrics."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np

        train = [(r["step"], r["loss"]) for r in self.records if "loss" in r]
        evals = [r for r in self.records if "val_loss" in r]
        panels = step_metric_panels(self.records)
        cols = min(len(panels), 3)
        rows = -(-len(panels) // 3) if panels else 1
        fig = plt.figure(figsize=(8 + 3.6 * cols, max(4.5, 2.6 * rows)), dpi=100)
        grid = fig.add_gridspec(rows, 1 + cols, width_ratios=[8.0] + [3.6] * cols)
        ax = fig.add_subplot(grid[:, 0])
        for i, (panel, keys) in enumerate(panels.items()):
            side = fig.add_subplot(grid[i // 3, 1 + i % 3])
            for key in keys:
                points = [(r["step"], r[key]) for r in self.records if "loss" in r and key in r]
                side.plot(*zip(*points), lw=0.8, label=key.partition("/")[2] or key)
            side.set_title(panel, fontsize=9)
            side.tick_params(labelsize=7)
            side.grid(alpha=0.3)
            if len(keys) > 1:
                side.legend(fontsize=7)
        if train:
            ax.plot(*zip(*train), lw=0.6, alpha=0.5, color="tab:blue", label="train (per step)")
        if evals:
            steps = [r["step"] for r in evals]
            ax.plot(steps, [r["train_loss"] for r in evals], "o-", color="tab:blue", label="train (eval)")
            ax.plot(steps, [r["val_loss"] for r in evals], "o-", color="tab:orange", label="val")
        ax.set_xlabel("step")
        ax.set_ylabel(
            "loss" if panels else "cross-entropy loss (nats/token)"
        )  # an objective of its own: its loss
        ax.grid(alpha=0.3)
        ax.legend()
        top = ax.secondary_xaxis(
            "top",
            functions=(lambda s: np.multiply(s, tokens_per_step), lambda t: np.divide(t, tokens_per_step)),
        )
        top.set_xlabel("tokens")
        fig.tight_layout()
        atomic_write(self.plot_path, lambda tmp: fig.savefig(tmp, format="png"))
        plt.close(fig)
        return self.plot_path


class Progress:
    """The progress bar of a run: steps with rate and ETA, then loss, tokens/s and MFU.

    ``peak`` is ``(card, FLOP/s)`` from ``gptlab.inspect.flops.peak_flops`` (None: no MFU, e.g. on a CPU).
    """

    def __init__(
        self,
        total: int,
        initial: int,
        enabled: bool,
        tokens_per_step: int,
        flops_per_token: float,
        peak: tuple[str, float] | None,
        devices: int = 1,
    ) -> None:
        from tqdm import tqdm

        self.bar = tqdm(
            total=total,
            initial=initial,
            disable=not enabled,
            unit="step",
            dynamic_ncols=True,
            mininterval=0.5,
            smoothing=0.1,
        )
        self.enabled = enabled
        self.tokens_per_step, self.flops_per_token = tokens_per_step, flops_per_token
        self.peak, self.devices = peak, devices
        self._shown = 0.0
        if enabled and peak is not None:
            self.write(f"MFU against the {peak[0]} peak of {peak[1] / 1e12:,.0f} TFLOP/s per device")

    def step(
        self, loss: float | None, dt: float, force: bool = False, extra: dict[str, float] | None = None
    ) -> None:
        """One step done in ``dt`` seconds; the figures are redrawn at most twice a second.
        ``extra``: the objective's step metrics, shown after the loss in short form."""
        self.bar.update(1)
        now = time.monotonic()
        if self.enabled and loss is not None and (force or now - self._shown > 0.5):
            self._shown = now
            self.bar.set_postfix_str(self.postfix(loss, dt, extra), refresh=False)

    def postfix(self, loss: float, dt: float, extra: dict[str, float] | None = None) -> str:
        from gptlab.inspect.flops import mfu

        tok_s = self.tokens_per_step / dt if dt > 0 else 0.0
        text = f"loss {loss:.4f}"
        text += "".join(f" {key} {value:.3g}" for key, value in (extra or {}).items())
        text += f" | {tok_s:,.0f} tok/s"
        if self.peak is not None:
            text += f" | MFU {100 * mfu(self.flops_per_token, tok_s, self.peak[1], self.devices):.1f}%"
        return text

    def write(self, line: str) -> None:
        self.bar.write(line)

    def close(self) -> None:
        self.bar.close()


class _TensorBoard:
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise GptlabError(
                'loggers=["tensorboard"] needs the tensorboard package: pip install tensorboard'
            ) from None
        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, record: dict[str, Any]) -> None:
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float):
                self.writer.add_scalar(key, value, record["step"])

    def close(self) -> None:
        self.writer.close()


class _WandB:
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise GptlabError('loggers=["wandb"] needs the wandb package: pip install wandb') from None
        self.run = wandb.init(project="gptlab", name=run_dir.name, dir=str(run_dir), config=config)

    def log(self, record: dict[str, Any]) -> None:
        self.run.log({k: v for k, v in record.items() if k != "step"}, step=record["step"])

    def close(self) -> None:
        self.run.finish()


class Sink(Protocol):
    """Where the records go besides ``metrics.jsonl``: made from ``(run_dir, config)``."""

    def log(self, record: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


SINKS: dict[str, Callable[[Path, dict[str, Any]], Sink]] = {"tensorboard": _TensorBoard, "wandb": _WandB}
