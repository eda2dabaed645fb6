"""The one-row decode step's speed by how it was made: layer by layer, ``torch.compile``, the stored package.

    OMP_NUM_THREADS=1 python bench/compiled_step_speed.py [--store DIR]

gptlab demo's model shape (random weights), fp32, one sequence: 200 greedy tokens timed after 20
untimed, for each path in turn (layer by layer twice, the stored AOTInductor package twice: compiled
into ``--store`` if it is empty, then loaded). Prints one JSON line: tokens/s per path and whether
every path gave the same greedy tokens.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import gptlab  # noqa: E402
from gptlab.generate import prepare_decoding  # noqa: E402
from gptlab.model import GPT, GPTConfig  # noqa: E402


def run(model: GPT, **settings: object) -> tuple[float, list[int]]:
    engine = prepare_decoding(model, **settings)  # type: ignore[arg-type]
    session = engine.dynamic_session(engine.plan(1), 1, max_len=256)
    tokens = []
    with torch.inference_mode():
        slot, logits = session.add([1, 2, 3])
        for i in range(220):
            if i == 20:
                start = time.perf_counter()
            logits = session.step({slot: int(logits.argmax())})[slot]
            tokens.append(int(logits.argmax()))
    return round(200 / (time.perf_counter() - start), 1), tokens


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", help="the compiled-step store (default: a temporary folder)")
    args = p.parse_args()
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=65,
        block_size=256,
        n_layer=4,
        n_head=4,
        n_embd=96,
        d_ff=288,
        pos="rope",
        norm="rmsnorm",
        mlp="relu2",
        bias=False,
        qk_norm=True,
    )
    model = gptlab.quantize(GPT(config).eval(), "fp32")
    with tempfile.TemporaryDirectory() as tmp:
        store = args.store or tmp
        paths = {
            "layers": dict(compile="off"),
            "stored_compiled": dict(compile="on", compile_cache=store, compile_wait=True),
            "torch_compile": dict(compile="on", compile_wait=True),
            "layers_again": dict(compile="off"),
            "stored_loaded": dict(compile="on", compile_cache=store, compile_wait=True),
        }
        rates, outputs = {}, []
        for name, settings in paths.items():
            rates[name], tokens = run(model, **settings)
            outputs.append(tokens)
    same = all(t == outputs[0] for t in outputs)
    print(json.dumps(dict(tokens_per_s=rates, same_greedy_tokens=same, threads=torch.get_num_threads())))


if __name__ == "__main__":
    main()
