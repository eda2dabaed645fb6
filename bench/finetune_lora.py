"""LoRA against full fine-tuning of one model at the same batch: trainable share, peak memory, step time.

    python bench/finetune_lora.py --init SRC [--batch 2] [--context 128] [--steps 6] [--rank 8]

``SRC`` is anything ``init=`` accepts (a gptlab checkpoint, a Hugging Face folder, a GGUF file).
Each mode runs in its own process: the model is loaded, the process's peak-RSS mark is reset
(``/proc/self/clear_refs``), then ``--steps`` optimizer steps run on random tokens (forward,
backward, AdamW step, as ``gptlab train`` does them) after two warm-up steps. Peak memory is
the RSS high-water mark over those steps (weights, gradients, optimizer state, activations);
step time is the median, as wall time and as CPU time of the process (less sensitive to other
load on a shared machine). LoRA is rank ``--rank`` on the attention projections (``qkv``,
``attn.proj``). Prints ONE JSON line with both modes and the ratios LoRA/full.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    from gptlab.hardware import release_memory

    gc.collect()
    release_memory()  # hand the loader's transient buffers back first
    Path("/proc/self/clear_refs").write_text("5")


def one_mode(args: argparse.Namespace) -> dict:
    import torch

    from gptlab.sources import load_source, resolve_source
    from gptlab.train.config import build_config
    from gptlab.train.init import FINETUNE
    from gptlab.train.lora import trainable_fraction
    from gptlab.train.optim import build_optimizer

    torch.set_num_threads(args.threads)
    cfg = build_config(
        None, [f"init={args.init}", f"finetune={args.mode}", f"lora_rank={args.rank}", "weight_decay=0.0"]
    )
    model, _ = load_source(args.init)
    model = FINETUNE[args.mode](model, cfg, {"path": str(resolve_source(args.init))}).train()
    trainable, total = trainable_fraction(model)
    opt = build_optimizer(model, cfg, "cpu")
    g = torch.Generator().manual_seed(0)
    V = model.config.vocab_size
    x = torch.randint(0, V, (args.batch, args.context), generator=g)
    y = torch.randint(0, V, (args.batch, args.context), generator=g)
    _reset_peak()
    times, cpu = [], []
    for step in range(args.steps + 2):
        t0, c0 = time.perf_counter(), time.process_time()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step >= 2:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    return {
        "mode": args.mode,
        "trainable": trainable,
        "total": total,
        "trainable_pct": round(100 * trainable / total, 3),
        "peak_mb": round(_peak_rss_mb(), 1),
        "step_s": round(statistics.median(times), 3),
        "step_cpu_s": round(statistics.median(cpu), 3),
        "loss": round(float(loss), 4),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--init", required=True)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--mode", choices=["full", "lora"], help="(internal) run one mode in this process")
    args = ap.parse_args()
    if args.mode:
        print(json.dumps(one_mode(args)))
        return 0
    out: dict = {"bench": "finetune_lora", "init": args.init, "batch": args.batch, "context": args.context}
    for mode in ("full", "lora"):
        argv = [sys.executable, __file__, *sys.argv[1:], "--mode", mode]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            sys.stderr.write(done.stderr)
            return 1
        out[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    full, lora = out["full"], out["lora"]
    out["lora_trainable_pct"] = lora["trainable_pct"]
    out["peak_ratio"] = round(lora["peak_mb"] / full["peak_mb"], 3)
    out["step_ratio"] = round(lora["step_s"] / full["step_s"], 3)
    out["step_cpu_ratio"] = round(lora["step_cpu_s"] / full["step_cpu_s"], 3)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    # the source tree, in place of this script's folder (whose gguf.py would shadow the gguf package)
    sys.path[0] = str(Path(__file__).resolve().parents[1] / "src")
    raise SystemExit(main())
