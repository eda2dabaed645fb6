"""Generation speed: prefill + greedy KV-cached decoding of a random-weight GPT on the CPU.

    python bench/generate.py --preset gpt2 --batch 1 --prompt-tokens 32 --new-tokens 128 --dtype bf16

Prints one JSON line: tokens_per_s (generated tokens / total time, prefill included),
decode_tokens_per_s, ms_per_step, prefill_ms, dtype, batch, peak_rss_mb, compiled_step (one
compiled graph per decode step), first_run_s (an 8-token warm-up, compilation included), and the
bandwidth bounds: weight bytes read per step against the read bandwidth measured in the same
run, and against the issue's 10.5 GB/s.
``--hf`` also times Hugging Face transformers' ``generate`` on the same shapes (gpt2 only);
``--plot PATH`` times a decode step at contexts up to the block size and draws it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gptlab.cli.options import resolve_dtype  # noqa: E402
from gptlab.generate import BatchSession, SampleConfig, prepare_decoding, prepared_of  # noqa: E402
from gptlab.generate.driver import decode_rows, start  # noqa: E402
from gptlab.hardware import inference_weights  # noqa: E402
from gptlab.model import GPT, GPTConfig  # noqa: E402
from gptlab.model.weight_formats import quantize  # noqa: E402

ISSUE_BANDWIDTH_GBS = 10.5  # the figure the generation issue gives for this machine


def _best_time(fn, repeats: int = 5) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def copy_bandwidth_gbs() -> float:
    """Memory copy bandwidth (read + write bytes per second) on a 256 MB buffer."""
    src = torch.empty(64 * 2**20, dtype=torch.float32).fill_(1.0)
    dst = torch.empty_like(src)
    return 2 * src.numel() * 4 / _best_time(lambda: dst.copy_(src)) / 1e9


def read_bandwidth_gbs() -> float:
    """Memory read bandwidth: bytes per second of summing a 256 MB buffer (what a decode step does)."""
    src = torch.empty(64 * 2**20, dtype=torch.float32).fill_(1.0)
    return src.numel() * 4 / _best_time(src.sum) / 1e9


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes a decode step must read: every matrix product's weights, scales and biases (a tied head
    reads the embedding table); not the embedding lookup (one row) or the small norm vectors."""
    from gptlab.model.quantized import InferenceLinear

    total = 0
    for m in model.modules():
        if isinstance(m, torch.nn.Linear | InferenceLinear):
            for t in (m.weight, getattr(m, "scales", None), m.bias):
                if t is not None:
                    total += t.numel() * t.element_size()
    return total


def build(preset: str, dtype: str) -> GPT:
    torch.manual_seed(0)
    model = GPT(GPTConfig.preset(preset)).eval()
    return quantize(model, dtype)


def run_once(model: GPT, prompts: list[list[int]], new_tokens: int) -> tuple[float, float, int]:
    config = SampleConfig(max_new_tokens=new_tokens, temperature=0)
    t0 = time.perf_counter()
    session, rows = start(model, None, prompts, config, None)
    t1 = time.perf_counter()
    n = sum(1 for e in decode_rows(session, rows) if e.token_id is not None)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, n


def hf_bench(
    batch: int,
    prompt_tokens: int,
    new_tokens: int,
    repeats: int,
    device: str = "cpu",
    dtype: torch.dtype = torch.float32,
    hf_config: dict | None = None,
) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(**(hf_config or {}))
    model = GPT2LMHeadModel(config).to(device=device, dtype=dtype).eval()
    idx = torch.randint(0, config.vocab_size, (batch, prompt_tokens), device=device)
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    with torch.inference_mode():
        model.generate(idx, **dict(kw, max_new_tokens=4, min_new_tokens=4))
        times = []
        for _ in range(repeats):
            sync()
            t = time.perf_counter()
            model.generate(idx, attention_mask=torch.ones_like(idx), **kw)
            sync()
            times.append(time.perf_counter() - t)
    med = statistics.median(times)
    return {"hf_tokens_per_s": round(batch * new_tokens / med, 2)}


def context_sweep(model: GPT, plot: str, steps: int = 16, rounds: int = 4) -> dict:
    """Median time of a batch-1 decode step at several context lengths → a PNG.

    The contexts are timed round-robin (``rounds`` × ``steps / rounds`` steps each), so the
    machine's drift over time falls on every context alike instead of showing up as a trend.
    """
    block = model.config.block_size
    contexts = [c for c in (32, 128, 256, 384, 512, 640, 768, 896, 1024 - steps) if c + steps <= block]
    sessions = []
    for c in contexts:
        session = BatchSession(model, 1, block)
        slot, _ = session.add(torch.randint(0, 1000, (c,)).tolist())
        sessions.append((session, slot))
    times: list[list[float]] = [[] for _ in contexts]
    for _ in range(rounds):
        for i, (session, slot) in enumerate(sessions):
            for _ in range(steps // rounds):
                t = time.perf_counter()
                session.step({slot: 1})
                times[i].append(time.perf_counter() - t)
    medians = [1e3 * statistics.median(t) for t in times]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(contexts, medians, "o-")
    ax.set_xlabel("context length (tokens in the KV cache)")
    ax.set_ylabel("ms per decode step")
    ax.set_ylim(0, max(medians) * 1.2)
    ax.set_title(
        f"{model.config.n_layer}-layer GPT, batch 1, {getattr(model, 'quantization', 'fp32')}, CPU 2 threads"
    )
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(plot, dpi=120)
    return {"context": contexts, "ms_per_step_at_context": [round(m, 2) for m in medians]}


def quality(steps: int) -> dict:
    """Held-out perplexity of a char model trained on tinyshakespeare, in fp32, bf16 and int8 weights."""
    import copy

    from gptlab.evaluate.loss import evaluate_tokens
    from gptlab.tokenizers import CharTokenizer

    path = Path(__file__).resolve().parents[2] / "shared" / "data" / "tinyshakespeare.txt"
    text = path.read_text(encoding="utf-8")
    tok = CharTokenizer.from_text(text)
    data = torch.tensor(tok.encode(text))
    split = int(0.9 * len(data))
    train, held = data[:split], data[split : split + 50_000]
    torch.manual_seed(0)
    block = 128
    model = GPT(GPTConfig.preset("char-tiny", block_size=block))
    opt = torch.optim.AdamW(model.parameters(), lr=2e-3)
    for _ in range(steps):
        starts = torch.randint(0, len(train) - block - 1, (32,))
        x = torch.stack([train[s : s + block] for s in starts])
        y = torch.stack([train[s + 1 : s + block + 1] for s in starts])
        _, loss = model(x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    out = {"quality_train_steps": steps}
    for mode in ("fp32", "bf16", "int8"):
        q = quantize(copy.deepcopy(model), mode)
        out[f"ppl_{mode}"] = round(
            evaluate_tokens(q, held.numpy(), batch_size=64, bytes_per_token=1.0).perplexity, 4
        )
    out["int8_ppl_increase_pct"] = round(100 * (out["ppl_int8"] / out["ppl_fp32"] - 1), 3)
    out["bf16_ppl_increase_pct"] = round(100 * (out["ppl_bf16"] / out["ppl_fp32"] - 1), 3)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="gpt2")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument(
        "--dtype",
        choices=["auto", "fp32", "bf16", "int8"],
        default="auto",
        help="auto: gptlab sample's choice for --batch sequences (gptlab.hardware.inference_weights)",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--no-compile",
        dest="compile",
        action="store_false",
        help="run batch-1 decode steps layer by layer (gptlab sample without --compile)",
    )
    p.add_argument(
        "--static",
        action="store_true",
        help="decode through the static path, its step compiled with frozen weights (any batch)",
    )
    p.add_argument("--hf", action="store_true", help="also time transformers' generate (gpt2 shapes)")
    p.add_argument("--plot", help="time a decode step against context length and save a PNG here")
    p.add_argument(
        "--quality",
        type=int,
        metavar="STEPS",
        help="only measure held-out perplexity of fp32/bf16/int8 after training a char model STEPS steps",
    )
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.quality:
        print(json.dumps(quality(args.quality)))
        return
    load_start = os.getloadavg()[0]
    # what --dtype auto means here, for this many sequences (gptlab sample's choice)
    setting = args.dtype
    args.dtype = inference_weights("cpu", args.batch) if setting == "auto" else resolve_dtype(setting, "cpu")
    model = build(args.preset, args.dtype)
    # --static: every batch through a static cache (a frozen step with --compile); otherwise the
    # dynamic cache (batch 1 as one compiled graph per step with --compile)
    engine = prepare_decoding(
        model, compile="on" if args.compile else "off", static=bool(args.static), compile_wait=True
    )
    torch.manual_seed(1)
    prompts = torch.randint(0, model.config.vocab_size, (args.batch, args.prompt_tokens)).tolist()
    t = time.perf_counter()
    run_once(model, prompts, 8)  # warm-up: compiles the decode step and the one-row kernels
    first_run = time.perf_counter() - t
    prefill, decode = [], []
    for _ in range(args.repeats):
        pf, dc, n = run_once(model, prompts, args.new_tokens)
        prefill.append(pf)
        decode.append(dc)
    pf, dc = statistics.median(prefill), statistics.median(decode)
    total_new = args.batch * args.new_tokens
    copy_bw, read_bw = copy_bandwidth_gbs(), read_bandwidth_gbs()
    wbytes = weight_bytes(model)
    decode_tps = args.batch * (args.new_tokens - 1) / dc
    result = {
        "preset": args.preset,
        "dtype": args.dtype,
        "dtype_setting": setting,
        "batch": args.batch,
        "prompt_tokens": args.prompt_tokens,
        "new_tokens": args.new_tokens,
        "tokens_per_s": round(total_new / (pf + dc), 2),
        "decode_tokens_per_s": round(decode_tps, 2),
        "ms_per_step": round(1e3 * dc / (args.new_tokens - 1), 2),
        "prefill_ms": round(1e3 * pf, 2),
        "weight_mb_per_step": round(wbytes / 1e6, 1),
        "copy_bandwidth_gbs": round(copy_bw, 2),
        "read_bandwidth_gbs": round(read_bw, 2),
        # the bound from the bandwidth measured now, and the issue's (10.5 GB/s)
        "bandwidth_bound_tokens_per_s": round(args.batch * read_bw * 1e9 / wbytes, 2),
        "fraction_of_bound": round(decode_tps * wbytes / (args.batch * read_bw * 1e9), 3),
        "issue_bound_tokens_per_s": round(args.batch * ISSUE_BANDWIDTH_GBS * 1e9 / wbytes, 2),
        "fraction_of_issue_bound": round(decode_tps * wbytes / (args.batch * ISSUE_BANDWIDTH_GBS * 1e9), 3),
        "path": engine.plan(args.batch).session,
        "plan": str(engine.plan(args.batch)),
        "compiled_step": any(step.compiled_calls for step in prepared_of(model).compiled_steps)
        or bool(engine.static and engine.static.compiled),
        "first_run_s": round(first_run, 2),
        "repeats": args.repeats,
        "threads": args.threads,
        "loadavg_at_start": round(load_start, 2),
    }
    if args.hf:
        result.update(hf_bench(args.batch, args.prompt_tokens, args.new_tokens, args.repeats))
    if args.plot:
        result.update(context_sweep(model, args.plot))
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
