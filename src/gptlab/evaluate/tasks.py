"""``gptlab eval CKPT --tasks NAMES``: lm-evaluation-harness tasks run in-process on the ``gptlab`` model.

The same run as ``lm_eval --model gptlab --model_args pretrained=CKPT --tasks NAMES`` (``python -m
gptlab.evaluate``), with the model opened once here. lm-eval is the optional ``eval`` extra; without it
the command says how to install it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from gptlab.errors import GptlabError

INSTALL = (
    "lm-evaluation-harness is not installed; `pip install 'gptlab[eval]'` installs it (lm-eval[api]==0.4.13)"
)
#: The offline tasks shipped with gptlab (``evals/`` at the repository root).
SHIPPED = Path(__file__).resolve().parents[3] / "evals"


def require_lm_eval() -> None:
    """One ``GptlabError`` naming the extra when lm-eval is absent."""
    if importlib.util.find_spec("lm_eval") is None:
        raise GptlabError(INSTALL)


@dataclass
class TaskRun:
    """What to run: task names, where else to find task YAMLs, and lm-eval's options."""

    tasks: list[str]
    include_path: list[str] = field(default_factory=list)
    num_fewshot: int | None = None
    limit: float | None = None
    apply_chat_template: bool = False
    batch_size: int = 8
    seed: int = 1234


def task_manager(include_path: list[str]):  # -> lm_eval.tasks.TaskManager (an optional dependency's type)
    """lm-eval's tasks plus each ``include_path`` folder (and ``evals/`` where this checkout has it)."""
    from lm_eval.tasks import TaskManager

    paths = [str(p) for p in include_path]
    for p in paths:
        if not Path(p).is_dir():
            raise GptlabError(f"--include-path {p}: not a folder of task YAML files")
    if SHIPPED.is_dir() and str(SHIPPED) not in paths:
        paths.append(str(SHIPPED))
    return TaskManager(include_path=paths or None)


def run_tasks(checkpoint: str, run: TaskRun, dtype: str = "fp32", device: str = "cpu") -> dict:
    """lm-eval's results dict for ``run`` on ``checkpoint`` (``results``, ``versions``, ``n-shot``, …)."""
    require_lm_eval()
    import lm_eval

    from gptlab.evaluate.harness import GptlabLM

    manager = task_manager(run.include_path)
    unknown = [t for t in run.tasks if not manager.match_tasks([t])]
    if unknown:
        raise GptlabError(
            f"unknown task(s) {', '.join(unknown)}; `lm_eval ls tasks --include_path DIR` lists them "
            f"(gptlab's own: {', '.join(sorted(p.stem for p in SHIPPED.glob('*/*.yaml')))})"
        )
    lm = GptlabLM(pretrained=checkpoint, dtype=dtype, device=device, batch_size=run.batch_size)
    results = lm_eval.simple_evaluate(
        model=lm,
        tasks=run.tasks,
        num_fewshot=run.num_fewshot,
        limit=run.limit,
        task_manager=manager,
        apply_chat_template=run.apply_chat_template,
        log_samples=False,
        random_seed=run.seed,
        numpy_random_seed=run.seed,
        torch_random_seed=run.seed,
        fewshot_random_seed=run.seed,
    )
    if results is None:
        raise GptlabError("lm-eval returned no results")
    return results


def table(results: dict) -> str:
    """lm-eval's own markdown table of ``results`` (and of groups, when there are any)."""
    from lm_eval.utils import make_table

    text = make_table(results)
    if results.get("groups"):
        text += "\n" + make_table(results, "groups")
    return text
