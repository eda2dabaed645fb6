"""On one GPU, side by side in one run: training, decoding and serving GPT-2 124M against the yardsticks.

    python bench/gpu.py                          # every figure (needs CUDA)
    python bench/gpu.py --only decode --batches 1,64
    python bench/gpu.py --only train --profile 15   # + each model's 15 costliest GPU kernels
    python bench/gpu.py --smoke                  # tiny shapes on the CPU, compile off: checks the script

Prints ONE JSON line per figure:

* ``train``: ms/step, tokens/s and MFU of one training step (batch 16 × 1024, bf16 autocast,
  ``torch.compile``, fused AdamW, clipping) of ``bench/baseline_minimal.py``'s nanoGPT-style model
  (vocabulary 50,304 as nanoGPT pads it) and of gptlab's ``GPT`` (``model.preset=gpt2`` with
  ``vocab_multiple`` 64 and 1, each with the plain and the chunked head + loss, ``--loss-impls``),
  through the same minimal loop on the same tokens (a random Markov
  chain with 4 successors per token: the best loss is ln 4, so ``last_loss`` and
  ``mean_loss_last10`` compare learning);
  ``vs_baseline`` is the tokens/s ratio. One more gptlab line (``vocab_multiple`` 64, plain loss) runs
  the ``--fp8-layers`` groups' products in FP8 (``gptlab.model.fp8``; GPUs of capability ≥ 8.9, else
  the line says why it is skipped; under ``--smoke`` it runs ``_scaled_mm``'s CPU kernel, a check of
  the script and not a speed). MFU uses ``gptlab size``'s training FLOPs per token;
  ``peak_mem_mb`` is the CUDA allocator's high-water mark over the timed steps.
* ``decode``: greedy decoding, 32-token prompt, 128 new tokens, bf16 weights, at batch 1, 8 and 64:
  ``generate_ids`` (the static cache + CUDA graphs path; ``compiled`` says the graphs ran) and
  transformers' ``generate`` on the same shapes, with the ratio.
* ``serve``: ``bench/serve_load.py`` against ``gptlab serve`` of a random GPT-2 124M checkpoint,
  64 concurrent streams (aggregate tokens/s; every stream checked for well-formedness).

Without CUDA (and without ``--smoke``) it prints one line saying so and exits with status 2.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))
sys.path.insert(0, str(HERE.parent))  # the checkout: bench/ imports as the package `bench`

from bench import baseline_minimal  # noqa: E402
from bench.generate import hf_bench  # noqa: E402
from gptlab.generate import generate_ids  # noqa: E402
from gptlab.generate.prepared import prepare_decoding, prepared_of  # noqa: E402
from gptlab.inspect.flops import mfu, peak_flops, training_flops_per_token  # noqa: E402
from gptlab.interop.hf import export_family  # noqa: E402
from gptlab.model import GPT, GPTConfig  # noqa: E402

SMOKE = dict(n_layer=2, n_head=2, n_embd=64, block_size=64, vocab_size=500)


def emit(figure: str, **fields) -> None:
    print(json.dumps({"figure": figure, **fields}), flush=True)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


# ------------------------------------------------------------------ training
def minimal_model(config: GPTConfig, vocab: int) -> torch.nn.Module:
    """``baseline_minimal.MinimalGPT`` at ``config``'s shapes (the module reads them from its globals)."""
    for name, value in dict(
        N_LAYER=config.n_layer, N_HEAD=config.n_head, N_EMBD=config.n_embd, BLOCK=config.block_size
    ).items():
        setattr(baseline_minimal, name, value)
    return baseline_minimal.MinimalGPT(vocab)


def markov_tokens(vocab: int, rows: int, length: int, successors: int = 4) -> torch.Tensor:
    """Rows of a random Markov chain where each token has ``successors`` equally likely next tokens.

    The best possible loss is ``ln(successors)`` (1.386 nats), so "equal loss after the same steps"
    compares how fast each model learns, which uniform random tokens (loss ln V forever) cannot.
    """
    g = torch.Generator().manual_seed(0)
    table = torch.randint(0, vocab, (vocab, successors), generator=g)
    out = torch.empty(rows, length, dtype=torch.long)
    out[:, 0] = torch.randint(0, vocab, (rows,), generator=g)
    for t in range(1, length):
        out[:, t] = table[out[:, t - 1], torch.randint(0, successors, (rows,), generator=g)]
    return out


def profile(one_step, device: str, n: int, steps: int = 3) -> list[tuple[str, float]]:
    """The ``n`` kernels (GPU; operators on a CPU) with the most self time per step, in ms."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        for it in range(steps):
            one_step(it)
        sync(device)
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    rows = sorted(prof.key_averages(), key=lambda e: getattr(e, key), reverse=True)[:n]
    return [(e.key[:80], round(getattr(e, key) / 1e3 / steps, 3)) for e in rows]


def time_training(model, loss_of, args, device: str, tokens: torch.Tensor) -> dict:
    """Mean ms/step after ``args.warmup`` steps of one minimal loop, the same for every model."""
    model.to(device).train()
    fused = device.startswith("cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=fused)
    step_model = torch.compile(model) if args.compile else model
    autocast = torch.autocast(device.split(":")[0], dtype=torch.bfloat16, enabled=fused)
    B, T = args.train_batch, tokens.size(1) - 1
    batches = [(tokens[i : i + B, :-1].contiguous(), tokens[i : i + B, 1:].contiguous()) for i in range(8)]

    def one_step(it: int) -> torch.Tensor:
        x, y = batches[it % len(batches)]
        with autocast:
            loss = loss_of(step_model, x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    times, losses = [], []
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
    for it in range(args.warmup + args.steps):
        sync(device)
        t = time.perf_counter()
        losses.append(one_step(it))
        sync(device)
        if it >= args.warmup:
            times.append(time.perf_counter() - t)
    top = profile(one_step, device, args.profile) if args.profile else None
    ms = 1e3 * statistics.fmean(times)
    cuda = device.startswith("cuda")
    return {
        **({"peak_mem_mb": round(torch.cuda.max_memory_allocated() / 2**20)} if cuda else {}),
        **({"top_kernels_ms_per_step": top} if top else {}),
        "ms_per_step": round(ms, 2),
        "tokens_per_s": round(B * T / ms * 1e3, 1),
        "last_loss": round(float(losses[-1]), 4),
        # one batch's loss is noisy (0.52-0.83 between runs of one seed on an H100): the mean of the last
        # 10 steps covers every one of the 8 batches the loop cycles through
        "mean_loss_last10": round(float(torch.stack(losses[-10:]).mean()), 4),
    }


def train_figures(args, device: str, base: GPTConfig) -> None:
    tokens = markov_tokens(base.vocab_size, args.train_batch + 8, base.block_size + 1).to(device)
    flops = training_flops_per_token(base)  # per token: the formula of gptlab size and gptlab train
    peak = peak_flops(device, "bfloat16")

    def mfu_pct(tps: float) -> float | None:
        return round(100 * mfu(flops, tps, peak[1]), 1) if peak else None

    torch.manual_seed(0)
    nano_vocab = 64 * -(-base.vocab_size // 64)
    ref = time_training(minimal_model(base, nano_vocab), lambda m, x, y: m(x, y), args, device, tokens)
    emit(
        "train",
        impl="nanoGPT-style (bench/baseline_minimal.py)",
        vocab=nano_vocab,
        mfu_pct=mfu_pct(ref["tokens_per_s"]),
        **ref,
    )

    def gptlab_line(multiple: int, loss_impl: str, fp8: list[str] | None = None, **note) -> None:
        """One ``train`` line of gptlab's GPT, trained as ``gptlab train`` does (the loss alone)."""
        from gptlab.errors import GptlabError
        from gptlab.model.fp8 import enable_fp8

        torch.manual_seed(0)
        model = GPT(base.replace(vocab_multiple=multiple)).set_loss_impl(loss_impl, keep_logits=False)
        label = dict(
            impl="gptlab GPT + fp8" if fp8 else "gptlab GPT", vocab_multiple=multiple, loss_impl=loss_impl
        )
        label |= {"fp8": fp8, "wgrad": args.fp8_wgrad, **note} if fp8 else note
        if fp8:
            try:  # --smoke: _scaled_mm's CPU kernel, a check of the script, not a speed
                enable_fp8(model, fp8, device, wgrad=args.fp8_wgrad, check=not args.smoke)
            except GptlabError as exc:
                emit("train", **label, skipped=str(exc))
                return
        got = time_training(model, lambda m, x, y: m(x, y)[1], args, device, tokens)
        ratio = float(
            f"{got['tokens_per_s'] / ref['tokens_per_s']:.4g}"
        )  # 4 significant digits: a small ratio keeps them
        emit("train", **label, mfu_pct=mfu_pct(got["tokens_per_s"]), vs_baseline=ratio, **got)

    for multiple, loss_impl in itertools.product(args.vocab_multiples, args.loss_impls):
        gptlab_line(multiple, loss_impl)
    if args.fp8_layers:  # the products of these layer groups in FP8 (vocab_multiple 64, plain loss)
        smoke = {"note": "CPU reference kernel: checks the script, not a speed"} if args.smoke else {}
        gptlab_line(64, "plain", args.fp8_layers, **smoke)
    _free(device)


# ------------------------------------------------------------------ decoding
def decode_figures(args, device: str, base: GPTConfig) -> None:
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    torch.manual_seed(0)
    model = GPT(base).to(device=device, dtype=dtype).eval()
    if args.smoke:  # the CPU default is the dynamic path: ask for the static one, run eagerly
        prepare_decoding(model, static=True, compile="off")
    hf_config = export_family(base).config_to_hf(base)  # the same shapes, as transformers names them
    for batch in args.batches:
        idx = torch.randint(0, base.vocab_size, (batch, args.prompt_tokens), device=device)
        run = functools.partial(generate_ids, model, idx, args.new_tokens, temperature=0)
        t = time.perf_counter()
        run()  # the first run prefills, compiles and captures this bucket's graph
        first = time.perf_counter() - t
        times = []
        for _ in range(args.repeats):
            sync(device)
            t = time.perf_counter()
            run()
            sync(device)
            times.append(time.perf_counter() - t)
        tps = batch * args.new_tokens / statistics.median(times)
        session = prepared_of(model).static
        hf = hf_bench(batch, args.prompt_tokens, args.new_tokens, args.repeats, device, dtype, hf_config)
        emit(
            "decode",
            batch=batch,
            dtype=str(dtype).removeprefix("torch."),
            prompt_tokens=args.prompt_tokens,
            new_tokens=args.new_tokens,
            tokens_per_s=round(tps, 1),
            hf_tokens_per_s=hf["hf_tokens_per_s"],
            vs_hf=round(tps / hf["hf_tokens_per_s"], 2),
            static_path=session is not None,
            compiled=bool(session and session.compiled),
            lookahead=session.lookahead if session else None,
            first_run_s=round(first, 2),
        )
    _free(device)


# ------------------------------------------------------------------ serving
def serve_figure(args, base: GPTConfig) -> None:
    import gptlab
    from bench import serve_load
    from gptlab.tokenizers import CharTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        tok = CharTokenizer.from_text("".join(chr(c) for c in range(32, 127)) + "\n")
        gptlab.save(GPT(base), tok, Path(tmp) / "gpt2")  # GPT-2 124M's compute; the sampler sees the chars
        ns = argparse.Namespace(
            api_key=None, prompt="ROMEO:\n", max_tokens=args.new_tokens, temperature=1.0, model=None,
            single_runs=1, timeout=600.0, concurrency=args.streams,
        )  # fmt: skip
        with serve_load.serve(str(Path(tmp) / "gpt2"), args.streams, serve_flags(), timeout=600) as url:
            # one untimed load first: the server compiles its step and captures the buckets' graphs
            body = {"prompt": ns.prompt, "max_tokens": ns.max_tokens, "temperature": 1.0, "stream": True}
            asyncio.run(serve_load.run_load(url, args.streams, body, ns.timeout))
            result = serve_load.measure(url, ns)
    emit("serve", streams=args.streams, **{k: v for k, v in result.items() if k != "bench"})


def serve_flags() -> list[str]:
    """bf16 weights, on the GPU (``--device`` where this gptlab's ``serve`` has it; else its default)."""
    from gptlab.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    serve = sub.choices["serve"]
    has_device = any("--device" in a.option_strings for a in serve._actions)
    return ["--dtype", "bf16", *(["--device", "cuda"] if has_device else [])]


def _free(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default="train,decode,serve", help="comma-separated: train, decode, serve")
    p.add_argument(
        "--smoke", action="store_true", help="tiny shapes on the CPU, compile off (a check, not a figure)"
    )
    p.add_argument("--steps", type=int, default=100, help="timed training steps (after --warmup)")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--train-batch", type=int, default=16)
    p.add_argument("--vocab-multiples", default="64,1", help="gptlab's vocab_multiple values to train")
    p.add_argument("--loss-impls", default="plain,chunked", help="gptlab's head + loss paths to train")
    p.add_argument(
        "--fp8-layers",
        default="mlp,head",
        help="layer groups (mlp, attn, head, all) of the extra FP8 train line; '' leaves it out",
    )
    p.add_argument("--fp8-wgrad", default="bf16", help="the FP8 line's weight-gradient product: bf16 or fp8")
    p.add_argument(
        "--profile", type=int, default=0, metavar="N", help="also list each model's N most expensive kernels"
    )
    p.add_argument("--batches", default="1,8,64", help="decoding batch sizes")
    p.add_argument("--prompt-tokens", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--streams", type=int, default=64, help="concurrent streams against the server")
    args = p.parse_args(argv)
    if not torch.cuda.is_available() and not args.smoke:
        print(
            "error: bench/gpu.py measures a CUDA GPU and this machine has none; --smoke checks it on the CPU"
        )
        return 2
    device = "cpu" if args.smoke else "cuda"
    base = GPTConfig.preset("gpt2", **(SMOKE if args.smoke else {}))
    args.compile = not args.smoke
    args.batches = [int(b) for b in args.batches.split(",")]
    args.vocab_multiples = [int(v) for v in args.vocab_multiples.split(",")]
    args.loss_impls = args.loss_impls.split(",")
    args.fp8_layers = [g for g in args.fp8_layers.split(",") if g]
    if args.smoke:
        args.steps, args.warmup, args.train_batch, args.repeats = 2, 1, 2, 1
        args.new_tokens = min(args.new_tokens, 8)
    only = set(args.only.split(","))
    if device == "cuda":
        emit("device", name=torch.cuda.get_device_name(), torch=torch.__version__, cuda=torch.version.cuda)
    if "train" in only:
        train_figures(args, device, base)
    if "decode" in only:
        decode_figures(args, device, base)
    if "serve" in only:
        if args.smoke:
            emit("serve", skipped="--smoke: the server figure needs a GPU (gptlab serve of GPT-2 124M)")
        else:
            serve_figure(args, base)
    return 0


if __name__ == "__main__":
    sys.exit(main())
