"""Learning-rate schedules, chosen by name: the rate at step ``t`` (0-based) as a function of the config.

Warmup (all schedules): ``η_t = η·(t + 1)/W`` for ``t < W``. After it:

* ``cosine``:   ``η_t = η_min + ½·(η − η_min)·(1 + cos(π·(t − W)/(S − W)))``, reaching ``η_min`` at ``S``;
* ``linear``:   constant ``η`` until the warm-down starts at ``S − D``, then linear to ``η_min`` at ``S``;
* ``constant``: ``η`` throughout.

``S`` is ``max_steps``, ``W`` ``warmup_steps``, ``D`` ``warmdown_steps``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol


class ScheduleSettings(Protocol):
    """The settings a schedule reads (a ``TrainConfig`` has them all)."""

    schedule: str
    lr: float
    min_lr: float
    warmup_steps: int
    max_steps: int
    warmdown_steps: int


def _cosine(t: int, lr: float, min_lr: float, warmup: int, total: int, warmdown: int) -> float:
    span = max(total - warmup, 1)
    ratio = min(max(t - warmup, 0) / span, 1.0)
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * ratio))


def _linear(t: int, lr: float, min_lr: float, warmup: int, total: int, warmdown: int) -> float:
    start = total - warmdown
    if warmdown <= 0 or t < start:
        return lr
    return lr + (min_lr - lr) * min((t - start + 1) / warmdown, 1.0)


def _constant(t: int, lr: float, min_lr: float, warmup: int, total: int, warmdown: int) -> float:
    return lr


SCHEDULES: dict[str, Callable[[int, float, float, int, int, int], float]] = {
    "cosine": _cosine,
    "linear": _linear,
    "constant": _constant,
}


def learning_rate(step: int, cfg: ScheduleSettings) -> float:
    """``η_t`` at 0-based ``step`` of the schedule named ``cfg.schedule`` (see the module docstring)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    return SCHEDULES[cfg.schedule](
        step, cfg.lr, cfg.min_lr, cfg.warmup_steps, cfg.max_steps, cfg.warmdown_steps
    )
