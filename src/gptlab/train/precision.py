"""A run's device, precision and attention path, resolved once from the machine (``gptlab.hardware``).

``resolve(cfg, device)`` turns ``dtype = "auto"`` and ``attention = "auto"`` into what this
machine runs fast, and returns the record written to the run's ``train_config.json`` under
``"resolved"``. ``keep_resolved(cfg, saved)`` makes a resumed run keep that choice, even on a
machine where ``auto`` would now choose otherwise.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

from gptlab import hardware
from gptlab.train.config import TrainConfig

AUTO_FIELDS = ("dtype", "attention")


def resolve(cfg: TrainConfig, device: str) -> tuple[TrainConfig, dict[str, Any]]:
    """``cfg`` with its ``auto`` fields made concrete for ``device``, and the record of the choice."""
    plan = hardware.plan(device=device, dtype=cfg.dtype, attention=cfg.attention)
    record = {**plan.to_dict(), "requested": {k: getattr(cfg, k) for k in ("device", *AUTO_FIELDS)}}
    return dataclasses.replace(cfg, dtype=plan.dtype, attention=plan.attention), record


def announce(record: dict[str, Any]) -> None:
    """One line on stderr saying what was chosen; before it, for bf16 asked for explicitly on a CPU
    that only emulates it, one warning line."""
    if record["requested"]["dtype"] == "bfloat16":
        hardware.warn_if_emulated(record["device"], "bfloat16", "dtype=bfloat16")
    plan = hardware.Plan(**{k: v for k, v in record.items() if k != "requested"})
    sys.stderr.write(f"hardware: {plan.summary()}\n")


def keep_resolved(cfg: TrainConfig, saved: dict[str, Any] | None) -> TrainConfig:
    """A resumed run: every field still ``auto`` takes the value its first run resolved to."""
    resolved = (saved or {}).get("resolved") or {}
    kept = {k: resolved[k] for k in AUTO_FIELDS if getattr(cfg, k) == "auto" and k in resolved}
    return dataclasses.replace(cfg, **kept) if kept else cfg
