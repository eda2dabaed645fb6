"""``gptlab quantize``: a model → a checkpoint of int4 or int8 inference weights (offline).

gptlab quantize CKPT --to int4 --out CKPT_INT4    # matrices int4 (groups of 32), head and token table int8
gptlab quantize smollm2 --to int4 --out CKPT      # a GGUF file's Q4_0/Q4_1 blocks kept as they are
gptlab quantize HF_DIR --to int8 --out CKPT       # int8, one scale per output channel
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gptlab.errors import GptlabError

#: --to → the weight format written
FORMATS = ("int4", "int8")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "quantize",
        help="write a checkpoint of int4 or int8 inference weights from any model",
        description="Quantize a model (a gptlab checkpoint or run, a Hugging Face folder, a GGUF file, "
        "smollm2) into a checkpoint that sample, chat, serve and eval run as it is stored. int4: every "
        "matrix in groups of 32 inputs, w = (q - 8)*s + z, through PyTorch's CPU int4 kernel (a GGUF "
        "file's Q4_0/Q4_1 blocks are carried over, not requantized); the output head and the token "
        "table int8 (int4 where a GGUF file's table is Q4_0/Q4_1). int8: one scale per output channel. Converted tensor by tensor. Not for training.",
    )
    p.add_argument(
        "source", metavar="SRC", help="checkpoint, run directory, Hugging Face folder, GGUF file, smollm2"
    )
    p.add_argument("--to", choices=FORMATS, required=True, help="weight format to write")
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (must be new or empty)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import time

    from gptlab.checkpoint import save
    from gptlab.model.int4 import held_weights
    from gptlab.sources import source_kind, source_path

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GptlabError(f"{out}: already exists and is not an empty directory; choose a new --out")
    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer

    model: GPT
    tokenizer: Tokenizer | None
    started = time.perf_counter()
    path = source_path(args.source)
    kind = source_kind(path)
    if kind == "gguf":
        from gptlab.interop.gguf import from_gguf, tokenizer_from_gguf
        from gptlab.interop.gguf_kept import from_gguf_kept

        model = from_gguf_kept(path, "int4") if args.to == "int4" else from_gguf(path, quantize=args.to)
        tokenizer = tokenizer_from_gguf(path)
    elif kind == "hf":
        from gptlab.interop.hf import from_hf, tokenizer_from_hf

        model, tokenizer = from_hf(path, quantize=args.to), tokenizer_from_hf(path)
    else:
        import gptlab

        model, tokenizer = gptlab.load(path, quantize=args.to)
    save(model, tokenizer, out)
    print(f"wrote gptlab checkpoint {out} ({held_weights(model)}) in {time.perf_counter() - started:.1f} s")
    return 0
