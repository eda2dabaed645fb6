"""Compiled decode step paid for once: how soon a first and a second process decode at compiled speed.

    python bench/compile_once.py --model smollm2 --dtype bf16
    python bench/compile_once.py --model demo --dtype fp32 --via torch-compile

Each round starts a fresh Python process that loads the model, asks for the compiled one-row step
(``prepare_decoding(model, compile="on", compile_cache=DIR)``: compiled in the background while it
decodes eagerly) and decodes greedily, one token at a time, until the compiled step has run
``--steady`` tokens. The first process finds an empty store (it compiles and stores the step); the
second finds what the first stored. ``--via torch-compile`` keeps no store: each process compiles
with ``torch.compile``, the second from inductor's warm on-disk caches (what torch's portable
"mega-cache", ``torch.compiler.save_cache_artifacts``/``load_cache_artifacts``, carries to another
machine). Prints one JSON line: per process ``to_compiled_s`` (process start to the first token of
the compiled step, imports and loading included), ``eager_tokens`` decoded meanwhile, ``source``
(loaded or compiled), ``compiled_tokens_per_s`` and ``eager_tokens_per_s``; and ``import_torch_s``,
the floor (``python -c "import torch"``) measured in the same run.
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

CHILD = r"""
import json, sys, time
import torch
import gptlab
from gptlab.generate import BatchSession, prepared_of, prepare_decoding
model_name, dtype, store, steady = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
if model_name == "demo":  # gptlab demo's model (the char-best recipe), random weights
    from gptlab.model import GPT, GPTConfig
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=65, block_size=64, n_layer=4, n_head=4, n_embd=96, d_ff=288, pos="rope",
                       norm="rmsnorm", mlp="relu2", bias=False, qk_norm=True)
    model = gptlab.quantize(GPT(config).eval(), dtype)
elif model_name == "smollm2" or model_name.endswith(".gguf"):  # a GGUF file (smollm2: the packaged one)
    from gptlab.sources import load_source
    model, _ = load_source(model_name)
    model = gptlab.quantize(model.eval(), dtype)
else:  # a checkpoint
    model, _ = gptlab.load(model_name, quantize=dtype)
engine = prepare_decoding(model, compile="on", compile_cache=None if store == "none" else store)
step = engine.one_token
session = engine.dynamic_session(engine.plan(1), 1, max_len=min(model.config.block_size, 256))
with torch.inference_mode():
    slot, logits = session.add([1, 2, 3, 4, 5, 6])
    eager_t, first_compiled, compiled_t, deadline = [], None, [], time.time() + 1800
    while len(compiled_t) < steady and time.time() < deadline:
        before = step.compiled_calls
        t = time.perf_counter()
        logits = session.step({slot: int(logits.argmax())})[slot]
        took = time.perf_counter() - t
        if step.compiled_calls > before:
            first_compiled = first_compiled or time.time()
            compiled_t.append(took)
        else:
            eager_t.append(took)
        if session.full(slot):
            session.remove(slot)
            slot, logits = session.add([1, 2, 3, 4, 5, 6])
rate = lambda ts: round(len(ts) / sum(ts), 1) if ts else None
print(json.dumps(dict(first_compiled=first_compiled, eager_tokens=len(eager_t), source=step.source,
                      compiled_tokens_per_s=rate(compiled_t[len(compiled_t) // 2:]),
                      eager_tokens_per_s=rate(eager_t[len(eager_t) // 2:]), report=engine.ran())))
"""


def child(model: str, dtype: str, store: str, steady: int) -> dict[str, object]:
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    start = time.time()
    run = subprocess.run(
        [sys.executable, "-c", CHILD, model, dtype, store, str(steady)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    if run.returncode != 0:
        raise SystemExit(run.stderr[-3000:])
    out = json.loads(run.stdout.strip().splitlines()[-1])
    first = out.pop("first_compiled")
    out["to_compiled_s"] = None if first is None else round(first - start, 2)
    out["wall_s"] = round(time.time() - start, 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--model", default="demo", help="demo (gptlab demo's shape, random weights) or a source: smollm2"
    )
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "int8"])
    p.add_argument("--via", default="store", choices=["store", "torch-compile"])
    p.add_argument("--steady", type=int, default=64, help="compiled tokens to decode in each process")
    args = p.parse_args()
    start = time.time()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    floor = time.time() - start
    with tempfile.TemporaryDirectory() as tmp:
        store = "none" if args.via == "torch-compile" else str(Path(tmp) / "compiled")
        first = child(args.model, args.dtype, store, args.steady)
        second = child(args.model, args.dtype, store, args.steady)
    import torch

    print(
        json.dumps(
            dict(
                model=args.model,
                dtype=args.dtype,
                via=args.via,
                batch=1,
                threads=torch.get_num_threads(),
                cpu=torch.backends.cpu.get_cpu_capability(),
                torch=torch.__version__,
                import_torch_s=round(floor, 2),
                first=first,
                second=second,
            )
        )
    )


if __name__ == "__main__":
    main()
