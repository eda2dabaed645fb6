"""A prompt's pass compiled ahead of time, against the eager pass that runs it today. One JSON line.

    python bench/kept_prefill.py MODEL [--tokens 505] [--rounds 3] [--package FILE]

MODEL is any model source (a GGUF file, ``smollm2``, a checkpoint). The prefill, a prompt of T tokens
from position 0 written into a float32 cache and the last position's logits, is exported with
``torch.export`` (T and the cache's capacity as symbols, T from 128: below it the int4 layers take
their kernel instead of dequantising) and compiled by AOTInductor into a package that reads the live
model's tensors, as ``gptlab.generate.one_token`` keeps the one-row step. Then, in one process, in
alternating blocks of ``--calls``, the eager prefill (``generate_ids(model, ids, 1)``, greedy) and the
package on the same ids; the figures are the medians per round. ``--package FILE`` keeps the package
there, and a later run reuses it (the export and compilation take minutes on 2 cores); without it the
package is written to a temporary folder and removed.

This is a measurement, not a path gptlab takes: the eager prefill is what every command runs.
"""

from __future__ import annotations

import argparse
import json
import operator
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import gptlab  # noqa: E402
from gptlab.compiling import load_package  # noqa: E402
from gptlab.generate import generate_ids  # noqa: E402
from gptlab.generate.one_token import _shared_copy  # noqa: E402
from gptlab.generate.plan import logits_of  # noqa: E402
from gptlab.model.kvcache import KVStore, KVView  # noqa: E402

MIN_TOKENS = 128


class Prefill(nn.Module):
    """The model's pass over a prompt from position 0, writing the cache: the last logits, float32."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.m = model

    def forward(
        self, idx: torch.Tensor, pos: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]
    ) -> torch.Tensor:
        t = idx.size(1)
        cache = [KVView(KVStore(k, v), write=0, end=t) for k, v in zip(keys, values, strict=True)]
        return logits_of(self.m.run(idx, pos=pos, cache=cache, last_only=True))[:, -1].float()


def cache(model: Any, capacity: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    cfg = model.config
    heads = getattr(cfg, "n_kv_head", None) or cfg.n_head
    shape = (1, heads, capacity, cfg.n_embd // cfg.n_head)
    return (
        [torch.zeros(shape) for _ in range(cfg.n_layer)],
        [torch.zeros(shape) for _ in range(cfg.n_layer)],
    )


def build(model: Any, path: Path) -> dict[str, float]:
    from torch._inductor import aoti_compile_and_package
    from torch.export import Dim

    twin = Prefill(_shared_copy(model))
    keys, values = cache(model, MIN_TOKENS + 72)
    examples = (torch.zeros(1, MIN_TOKENS + 8, dtype=torch.long), torch.arange(MIN_TOKENS + 8), keys, values)
    t, capacity = Dim("t", min=MIN_TOKENS, max=1 << 15), Dim("capacity", min=MIN_TOKENS + 2, max=1 << 16)
    layers = model.config.n_layer
    shapes = {
        "idx": {1: t},
        "pos": {0: t},
        "keys": [{2: capacity}] * layers,
        "values": [{2: capacity}] * layers,
    }
    start = time.perf_counter()
    with torch.inference_mode():
        program = torch.export.export(twin, examples, dynamic_shapes=shapes, strict=False)
    exported = time.perf_counter() - start
    options = {
        "realize_opcount_threshold": 10,
        "aot_inductor.package_constants_in_so": False,
        "always_keep_tensor_constants": True,
    }
    aoti_compile_and_package(program, package_path=str(path), inductor_configs=options)
    return {"export_s": round(exported, 1), "compile_s": round(time.perf_counter() - start - exported, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--tokens", type=int, default=505)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=4)
    parser.add_argument("--package", type=Path, default=None)
    args = parser.parse_args(argv)
    model = gptlab.load(args.model)[0]
    out: dict[str, Any] = {"bench": "kept_prefill", "model": args.model, "tokens": args.tokens}
    with tempfile.TemporaryDirectory() as scratch:
        path = args.package or Path(scratch) / "prefill.pt2"
        if not path.exists():
            out.update(build(model, path))
        loader = load_package(path)
    live = Prefill(model)
    loader.load_constants(
        {n: operator.attrgetter(n)(live) for n in loader.get_constant_fqns()}, False, True, True
    )
    ids = torch.randint(
        0, model.config.vocab_size, (1, args.tokens), generator=torch.Generator().manual_seed(0)
    )
    pos = torch.arange(args.tokens)

    def kept() -> torch.Tensor:
        keys, values = cache(model, args.tokens + 1)
        result: torch.Tensor = loader.boxed_run([ids, pos, *keys, *values])[0]
        return result

    def timed(f: Any) -> float:
        times = []
        for _ in range(args.calls):
            start = time.perf_counter()
            f()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    eager, compiled = [], []
    with torch.inference_mode():
        for _ in range(args.rounds):
            eager.append(round(timed(lambda: generate_ids(model, ids, 1, temperature=0)), 3))
            compiled.append(round(timed(kept), 3))
        keys, values = cache(model, args.tokens + 1)
        reference = Prefill(model)(ids, pos, keys, values)
        got = kept()
    out.update(
        eager_s=eager,
        kept_s=compiled,
        ratio=round(statistics.median(compiled) / statistics.median(eager), 3),
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
