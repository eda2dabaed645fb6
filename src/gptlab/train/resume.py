"""Resuming a run: the newest checkpoint whose files verify, and everything it restores.

A checkpoint records the SHA-256 of its files (``gptlab.checkpoint.integrity``). ``--resume`` takes
the newest ``ckpt-<step>`` that verifies; a newer one that does not (a changed byte, a missing shard)
is named in one warning line, with the step the run goes on from, and is left for the run to write
again when it reaches that step. The restored state is the weights, the optimizer, the loss scaler and
the RNG (every rank's own under FSDP), so on a CPU a resumed run is bitwise the uninterrupted one.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from gptlab import checkpoint as ckpt
from gptlab.checkpoint import files as ckpt_files
from gptlab.checkpoint import sharded
from gptlab.checkpoint.integrity import verify_checksums
from gptlab.errors import GptlabError
from gptlab.train.runtime import set_rng_state


@dataclass
class Resumed:
    """Where a resumed run stands: its step and the counters ``train_state.json`` kept."""

    step: int
    path: Path
    meta: dict[str, Any]


def newest_verified(run_dir: Path, announce: bool) -> tuple[int, Path] | None:
    """``(step, path)`` of the newest checkpoint whose files match their checksums (None: no checkpoint).

    ``announce`` (the main rank): a skipped newer checkpoint is one warning naming the file that differs.
    If none verifies, the newest one's error is raised.
    """
    ckpts = ckpt.list_checkpoints(run_dir)
    first_error: GptlabError | None = None
    for step, path in reversed(ckpts):
        try:
            verify_checksums(path)
        except GptlabError as exc:
            first_error = first_error or exc
            continue
        if first_error is not None and announce:
            warnings.warn(
                f"{first_error}; resuming from {path.name}, the newest checkpoint that verifies", stacklevel=2
            )
        return step, path
    if first_error is not None:
        raise GptlabError(
            f"{first_error}; no checkpoint of {run_dir} verifies, so there is nothing to resume"
        )
    return None


def load_latest(trainer: Any) -> Resumed | None:
    """Restore ``trainer`` (model, optimizer, scaler, RNG) from its run's newest verified checkpoint."""
    found = newest_verified(trainer.run_dir, trainer.info.is_main)
    if found is None:
        return None
    step, path = found
    is_sharded = ckpt_files.is_sharded(path)
    state, meta = ({}, sharded.read_info(path)) if is_sharded else ckpt.read_training_checkpoint(path)
    if meta.get("data_fingerprint") not in (None, trainer.data.fingerprint):
        raise GptlabError(
            f"{path} was trained on a different dataset than {trainer.data_dir}; "
            f"resume with the run's own --data"
        )
    config = ckpt.read_config(path / ckpt.CONFIG_FILE)
    if config.to_dict() != trainer.model_config.to_dict():
        raise GptlabError(
            f"{path}: the model settings differ from this run's; model.* overrides cannot change when resuming"
        )
    if is_sharded:  # every rank reads its shards (any number of ranks) and its own RNG
        sharded.load_training_state(
            path, trainer.model, trainer.optimizer, trainer.info, trainer.cfg.seed + step
        )
    else:
        ckpt.restore_weights(trainer.model, path)
        trainer.optimizer.load_state_dict(state["optimizer"])
        if trainer.scaler is not None and "scaler" in state:
            trainer.scaler.load_state_dict(state["scaler"])
        if trainer.info.is_main:
            set_rng_state(state["rng"], trainer.device_type)
        else:
            torch.manual_seed(trainer.cfg.seed + trainer.info.rank + step)
    return Resumed(int(meta["step"]), path, meta)
