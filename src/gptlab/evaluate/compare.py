"""Several runs side by side: their loss curves on one plot, and a table of their final figures.

Each run's ``metrics.jsonl``, written by the trainer, is read (``gptlab.checkpoint.rundir.read_metrics``):
per-step records (``loss``, ``tokens``, ``time_s``) and evaluation records (``train_loss``, ``val_loss``,
``val_bpb``). The curves are drawn against steps, tokens or seconds of training; a step's seconds are
the training wall time up to it, so runs on different machines or with different batch sizes compare
fairly by tokens.
``metrics`` plots an objective's step metrics instead of the loss (``gptlab compare RUN --metric
logp/chosen,logp/rejected``: how a DPO run's chosen and rejected answers' log-probabilities move).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptlab.checkpoint.rundir import METRICS_FILE, read_metrics
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write

X_AXES = {
    "steps": ("step", "step"),
    "tokens": ("tokens", "tokens"),
    "seconds": ("time_s", "seconds of training"),
}
COLUMNS = ("run", "steps", "tokens", "seconds", "tok/s", "train loss", "val loss", "best val", "val bpb")


@dataclass
class RunCurves:
    """One run's records, split into per-step and evaluation records."""

    name: str
    path: Path
    steps: list[dict[str, Any]]
    evals: list[dict[str, Any]]

    def x(self, record: dict[str, Any], axis: str) -> float | None:
        """The record's position on ``axis``; an evaluation takes the seconds of its step's record."""
        key = X_AXES[axis][0]
        if key in record:
            return record[key]
        same_step = [r for r in self.steps if r["step"] == record["step"] and key in r]
        return same_step[-1][key] if same_step else None

    def final(self) -> dict[str, Any]:
        """The figures of the table: the last step's and the last and best evaluation's."""
        last = self.steps[-1] if self.steps else {}
        seconds = last.get("time_s")
        tokens = last.get("tokens", self.evals[-1].get("tokens") if self.evals else None)
        vals = [r["val_loss"] for r in self.evals if "val_loss" in r]
        return {
            "run": self.name,
            "steps": max([r["step"] for r in self.steps + self.evals], default=0),
            "tokens": tokens,
            "seconds": seconds,
            "tok/s": tokens / seconds if tokens and seconds else None,
            "train loss": last.get("loss"),
            "val loss": vals[-1] if vals else None,
            "best val": min(vals) if vals else None,
            "val bpb": self.evals[-1].get("val_bpb") if self.evals else None,
        }


def load_runs(paths: list[str | os.PathLike[str]]) -> list[RunCurves]:
    """Each run directory's records; a directory without ``metrics.jsonl`` is an error naming it."""
    if not paths:
        raise GptlabError("give at least one run directory to compare")
    runs = []
    for path in map(Path, paths):
        records = read_metrics(path / METRICS_FILE)
        if not records:
            raise GptlabError(
                f"{path}: no {METRICS_FILE} records (is it a run directory made by `gptlab train`?)"
            )
        steps = [r for r in records if "loss" in r]
        evals = [r for r in records if "val_loss" in r]
        runs.append(RunCurves(path.name or str(path), path, steps, evals))
    names = [r.name for r in runs]
    for run in runs:  # two runs of the same name (a/run, b/run): use their paths
        if names.count(run.name) > 1:
            run.name = str(run.path)
    return runs


def _cell(value: Any, column: str) -> str:
    if value is None:
        return "-"
    if column in ("steps", "tokens"):
        return f"{int(value):,}"
    if column in ("seconds", "tok/s"):
        return f"{value:,.0f}" if value >= 100 else f"{value:.1f}"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def render_table(rows: list[dict[str, Any]]) -> str:
    """The final figures as an aligned text table, one run per row."""
    cells = [[_cell(row[c], c) for c in COLUMNS] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(COLUMNS)]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(COLUMNS, widths)))]
    for r in cells:
        lines.append(
            "  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths)))
        )
    return "\n".join(lines) + "\n"


def plot_runs(
    runs: list[RunCurves], out: str | os.PathLike[str], axis: str = "steps", metrics: list[str] | None = None
) -> Path:
    """Write a PNG: each run's per-step train loss (thin) and val loss (dots), one colour per run; or, with
    ``metrics``, those per-step keys (one line style per key)."""
    if axis not in X_AXES:
        raise GptlabError(f"unknown x axis {axis!r}; choose one of {', '.join(X_AXES)}")
    for key in metrics or []:
        if not any(key in r for run in runs for r in run.steps):
            known = sorted({k for run in runs for r in run.steps for k in r} - {"step", "tokens", "time_s"})
            raise GptlabError(f"no run logged {key!r}; the runs' per-step keys are {', '.join(known)}")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5), dpi=100)
    for i, run in enumerate(runs):
        color = f"C{i % 10}"
        if metrics:
            for j, key in enumerate(metrics):
                points = [(run.x(r, axis), r[key]) for r in run.steps if key in r]
                points = [(x, y) for x, y in points if x is not None]
                style = ("-", "--", ":", "-.")[j % 4]
                ax.plot(*zip(*points), style, lw=1.0, color=color, label=f"{run.name} {key}")
            continue
        train = [(run.x(r, axis), r["loss"]) for r in run.steps]
        train = [(x, y) for x, y in train if x is not None]
        if train:
            ax.plot(*zip(*train), lw=0.7, alpha=0.45, color=color, label=f"{run.name} train")
        val = [(run.x(r, axis), r["val_loss"]) for r in run.evals]
        val = [(x, y) for x, y in val if x is not None]
        if val:
            ax.plot(*zip(*val), "o-", ms=4, color=color, label=f"{run.name} val")
    ax.set_xlabel(X_AXES[axis][1])
    ax.set_ylabel(", ".join(metrics) if metrics else "loss (nats/token; a pair's for DPO)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = Path(out)
    if out.parent != Path(""):
        out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(out, lambda tmp: fig.savefig(tmp, format="png"))
    plt.close(fig)
    return out
