"""A run's settings: a new run's config and dataset, or a resumed run's saved ones; a finished run.

Above ``TrainConfig`` (``gptlab.train.config``), the precision choices kept when a run resumes
(``gptlab.train.precision``) and the checkpoints a run holds (``gptlab.train.resume``).
"""

from __future__ import annotations

import os
from pathlib import Path

from gptlab import checkpoint as ckpt
from gptlab.errors import GptlabError
from gptlab.train.config import DEFAULT_RECIPE, FINETUNE_RECIPE, TrainConfig, build_config
from gptlab.train.precision import keep_resolved
from gptlab.train.resume import newest_verified


def resolve_run(
    run_dir: str | os.PathLike[str],
    data_dir: str | os.PathLike[str] | None,
    resume: bool,
    config: str | None,
    overrides: list[str],
) -> tuple[TrainConfig, Path]:
    """The config and dataset of a new run (``config`` or the default recipe, then overrides) or of a
    resumed one (its saved settings, then ``config`` and overrides). A finished run resolves too:
    ``finished`` says so, and resuming it trains no step."""
    if not resume:
        ckpt.check_new_run(run_dir)
        if data_dir is None:
            raise GptlabError("--data DATA_DIR is required (make one with `gptlab prepare`)")
        default = FINETUNE_RECIPE if any(o.startswith("init=") for o in overrides) else DEFAULT_RECIPE
        return build_config(config or default, overrides), Path(data_dir)
    saved = ckpt.check_resumable(run_dir) or {}
    data = data_dir or saved.get("data")
    if data is None:
        raise GptlabError(f"{run_dir}: the dataset of this run is not recorded; give --data")
    cfg = keep_resolved(
        build_config(config, overrides, base=saved.get("train")), saved
    )  # auto as first resolved
    return cfg, Path(data)


def finished(run_dir: str | os.PathLike[str], cfg: TrainConfig) -> str | None:
    """For a run whose newest verified checkpoint reached ``cfg.max_steps``: one line saying it is finished
    and how to extend it (a scheduler's requeue of a finished run is then a no-op, not an error); else None."""
    found = newest_verified(Path(run_dir), announce=False)  # a corrupt last checkpoint is not "finished"
    step = found[0] if found else None
    if step is None or step < cfg.max_steps:
        return None
    return (
        f"{run_dir}: this run is finished (step {step} of max_steps={cfg.max_steps}); nothing to do. "
        f"To train further raise max_steps: gptlab train --out {run_dir} --resume max_steps={2 * step}"
    )


__all__ = ["finished", "resolve_run"]
