"""A prompt's pass kept compiled, against the eager pass, in one process. One JSON line.

    python bench/kept_prefill.py MODEL [--tokens 505] [--rounds 3] [--compile-cache DIR]
    python bench/kept_prefill.py MODEL --compile-cache DIR --also OLD/prompt.pt2   # beside another commit's pass

MODEL is any model source (a GGUF file, ``smollm2``, a checkpoint). The pass is the one ``gptlab
compile`` keeps beside the one-row step (``gptlab.generate.prompt_pass``): a prompt of T tokens from
position 0 written into the cache, and the last position's logits. It is compiled into the compile
cache first where the cache lacks it (``keep_prompt_pass``: ``export_compile_s``, minutes on 2 cores;
without ``--compile-cache`` into a temporary folder, removed afterwards), then loaded and verified as
a command loads it (``KeptPrompt``), and timed against the eager pass (``prompt_pass``) on the same ids
in alternating blocks of ``--calls``; the figures are the medians per round, with the largest logit
difference and whether the greedy token is the same.

``--also PACKAGE``: a ``prompt.pt2`` kept by another commit (say, the one before a change), loaded
unverified over the same model's tensors and timed in the same alternating blocks (``also_s``,
``also_ratio`` against this commit's package), with its largest logit difference from this commit's: a
"no speed lost" check across commits in one process, on the same machine state.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import gptlab  # noqa: E402
from gptlab.generate.prompt_pass import KeptPrompt, _loaded, keep_prompt_pass, prompt_pass  # noqa: E402
from gptlab.model.kvcache import default_cache_dtype  # noqa: E402


def cache(model: Any, capacity: int, dtype: torch.dtype) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    cfg = model.config
    shape = (1, cfg.n_kv_head or cfg.n_head, capacity, cfg.head_dim)
    return (
        [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layer)],
        [torch.zeros(shape, dtype=dtype) for _ in range(cfg.n_layer)],
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=505)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--compile-cache", type=Path, default=None)
    parser.add_argument("--also", type=Path, help="another commit's prompt.pt2, timed beside this one's")
    args = parser.parse_args(argv)
    model = gptlab.load(args.model)[0]
    dtype = default_cache_dtype(model.dtype, model.device)
    out: dict[str, Any] = {"bench": "kept_prefill", "model": args.model, "tokens": args.tokens}
    with tempfile.TemporaryDirectory() as scratch:
        root = args.compile_cache or Path(scratch)
        start = time.perf_counter()
        kept_now, how = keep_prompt_pass(model, root, dtype)
        if not kept_now:
            raise SystemExit(f"error: no prompt pass kept: {how}")
        if how == "compiled":
            out["export_compile_s"] = round(time.perf_counter() - start, 1)
        kept = KeptPrompt(root)
        ids = torch.randint(
            0, model.config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(0)
        )
        pos = torch.arange(args.tokens)

        def timed(run: Any) -> float:
            times = []
            for _ in range(args.calls):
                rows = cache(model, args.tokens + 1, dtype)
                start = time.perf_counter()
                run(model, ids, pos, *rows)
                times.append(time.perf_counter() - start)
            return statistics.median(times)

        # another commit's package over this model's tensors, unverified (its key names that commit's sources)
        also = None if args.also is None else _loaded(args.also, model, {})
        eager, compiled, others = [], [], []
        with torch.inference_mode():
            for _ in range(args.rounds):
                eager.append(round(timed(prompt_pass), 3))
                compiled.append(round(timed(kept), 3))
                if also is not None:
                    others.append(round(timed(also), 3))
            reference = prompt_pass(model, ids, pos, *cache(model, args.tokens + 1, dtype))
            got = kept(model, ids, pos, *cache(model, args.tokens + 1, dtype))
            if also is not None:
                theirs = also(model, ids, pos, *cache(model, args.tokens + 1, dtype))
                out["also_max_logit_diff"] = round(float((theirs - got).abs().max()), 4)
        if kept.eager_calls:
            raise SystemExit(f"error: the kept pass was not what ran ({kept.eager_calls} eager calls)")
    out.update(
        eager_s=eager,
        kept_s=compiled,
        ratio=round(statistics.median(compiled) / statistics.median(eager), 3),
        **(
            {
                "also_s": others,
                "also_ratio": round(statistics.median(others) / statistics.median(compiled), 3),
            }
            if others
            else {}
        ),
        max_logit_diff=round(float((got - reference).abs().max()), 4),
        same_argmax=bool(int(got.argmax()) == int(reference.argmax())),
        threads=torch.get_num_threads(),
        cpu=torch.backends.cpu.get_cpu_capability(),
        torch=torch.__version__,
    )
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
