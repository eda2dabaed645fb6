"""Training: the loop and everything it owns.

config.py        ``TrainConfig``, TOML recipes, ``key=value`` overrides, a new or resumed run's settings
loop.py          ``train(cfg, data_dir, run_dir)``: steps, accumulation, evaluation, checkpoints
runtime.py       threads, autocast, torch.compile, RNG states, Ctrl-C
optim.py         AdamW (decoupled weight decay) and Muon
schedule.py      learning-rate schedules ``η_t``
runs.py          a new or resumed run's settings (``resolve_run``), a finished run
reinforce.py     ``objective = "grpo"``: policy gradient with a group baseline from a reward function
rollouts.py      its pieces: the reward function, group advantages, the per-token loss, sampling
objective_eval.py  ``gptlab eval`` of an encoder or encoder–decoder: its objective on a dataset split
init.py          starting from pretrained weights (``init=SRC``, opened by ``gptlab.sources``)
lora.py          LoRA's training side (LoRA+ rates); the layers are ``gptlab.model.lora``
metrics.py       ``metrics.jsonl``, ``loss.png``, optional loggers
distributed.py   DDP under ``torchrun``
recipes/         built-in recipes (``--config NAME``)

Evaluation (loss, perplexity, bits per byte, ``gptlab eval``, ``gptlab compare``) is ``gptlab.evaluate``;
the periodic evaluation calls ``gptlab.evaluate.loss``. ``gptlab demo`` is ``gptlab.demo``.
"""

from gptlab.train.config import TrainConfig, build_config, recipe_names
from gptlab.train.loop import TrainResult, train
from gptlab.train.runs import resolve_run

__all__ = ["TrainConfig", "TrainResult", "build_config", "recipe_names", "resolve_run", "train"]
