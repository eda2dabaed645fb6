"""A run directory as a whole: its settings file, whether it holds a run, and removing one.

    RUN_DIR/train_config.json   {"train": TrainConfig, "model": GPTConfig, "data": DIR, "data_fingerprint": ...}
    RUN_DIR/ckpt-<step>/        training checkpoints (``gptlab.checkpoint.run``)
    RUN_DIR/metrics.jsonl        the trainer's records, one JSON object per line (``read_metrics``)
    RUN_DIR/loss.png, best.json, tensorboard/

Only files that a training run writes are ever removed.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from gptlab.checkpoint.files import list_checkpoints, read_json
from gptlab.checkpoint.run import clean_incomplete
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json

RUN_CONFIG_FILE = "train_config.json"
BEST_FILE = "best.json"
METRICS_FILE = "metrics.jsonl"
RUN_FILES = (METRICS_FILE, "loss.png", RUN_CONFIG_FILE, BEST_FILE)
RUN_DIRS = ("tensorboard", "wandb")


def read_run_config(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's ``train_config.json``, or None where there is none."""
    path = Path(run_dir) / RUN_CONFIG_FILE
    return read_json(path) if path.is_file() else None


def write_run_config(run_dir: str | os.PathLike[str], record: dict[str, Any]) -> None:
    atomic_write_json(Path(run_dir) / RUN_CONFIG_FILE, record)


def read_metrics(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Records of a metrics.jsonl; a torn last line (a killed run) is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "step" in rec:
            records.append(rec)
    return records


def holds_run(run_dir: str | os.PathLike[str]) -> bool:
    """True where ``run_dir`` holds a training run's settings or checkpoints."""
    run_dir = Path(run_dir)
    return run_dir.is_dir() and ((run_dir / RUN_CONFIG_FILE).is_file() or bool(list_checkpoints(run_dir)))


def check_new_run(run_dir: str | os.PathLike[str]) -> None:
    """Refuse to start a new run where one already is."""
    if holds_run(run_dir):
        raise GptlabError(
            f"{run_dir}: already holds a training run; pass --resume to continue it, or choose another --out"
        )


def check_resumable(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The saved settings of a run to resume (None for checkpoints without them); refuse a non-run."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise GptlabError(f"{run_dir}: no such run directory to resume; drop --resume to start a new run")
    if not holds_run(run_dir):
        raise GptlabError(f"{run_dir}: not a training run ({RUN_CONFIG_FILE} is missing); nothing to resume")
    return read_run_config(run_dir)


def latest_step(run_dir: str | os.PathLike[str]) -> int | None:
    """The step of the run's latest complete checkpoint, or None."""
    ckpts = list_checkpoints(run_dir)
    return ckpts[-1][0] if ckpts else None


def clear_run(run_dir: str | os.PathLike[str]) -> None:
    """Remove a run's checkpoints and records (only what a training run writes); other files stay."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        return
    if list_checkpoints(run_dir) and not (run_dir / RUN_CONFIG_FILE).exists():
        raise GptlabError(f"{run_dir}: holds checkpoints that are not a gptlab run; choose another --out")
    clean_incomplete(run_dir)
    for _, path in list_checkpoints(run_dir):
        shutil.rmtree(path)
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        if (run_dir / name).is_dir():
            shutil.rmtree(run_dir / name)


def discard_failed_start(run_dir: str | os.PathLike[str], existed: bool) -> None:
    """Undo a run that failed before its first checkpoint: its records go, and the directory too if
    this run made it and nothing else is in it. A run with checkpoints is left alone."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir() or list_checkpoints(run_dir):
        return
    clear_run(run_dir)
    if not existed and not any(run_dir.iterdir()):
        run_dir.rmdir()
