"""Training: the loop and everything it owns.

config.py        ``TrainConfig``, TOML recipes and ``key=value`` overrides
loop.py          ``train(cfg, data_dir, run_dir)``: steps, accumulation, evaluation, checkpoints
optim.py         AdamW (decoupled weight decay) and Muon
schedule.py      learning-rate schedules ``η_t``
evaluate.py      cross-entropy, perplexity, bits per byte
metrics.py       ``metrics.jsonl``, ``loss.png``, optional loggers
distributed.py   DDP under ``torchrun``
demo.py          ``gptlab demo``: prepare → train → sample
recipes/         built-in recipes (``--config NAME``)
"""

from gptlab.train.config import TrainConfig, build_config, recipe_names
from gptlab.train.loop import TrainResult, resolve_run, train

__all__ = ["TrainConfig", "TrainResult", "build_config", "recipe_names", "resolve_run", "train"]
