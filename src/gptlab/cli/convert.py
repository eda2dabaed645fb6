"""``gptlab convert``: Hugging Face model directories ↔ gptlab checkpoints (offline).

gptlab convert --from-hf HF_DIR --out CKPT     # GPT2LMHeadModel / LlamaForCausalLM → checkpoint
gptlab convert --to-hf CKPT --out HF_DIR       # checkpoint → config.json + model.safetensors
gptlab convert --consolidate RUN --out CKPT    # sharded (FSDP) checkpoint → one model.safetensors
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from gptlab.errors import GptlabError


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "convert",
        help="convert between Hugging Face transformers directories and gptlab checkpoints",
        description="Convert a GPT2LMHeadModel or LlamaForCausalLM directory into a gptlab checkpoint "
        "(with its GPT-2 tokenizer if it has vocab.json + merges.txt), or a gptlab checkpoint "
        "into a directory that transformers.AutoModelForCausalLM.from_pretrained loads. No network.",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("--from-hf", metavar="HF_DIR", help="Hugging Face model directory to import")
    which.add_argument("--to-hf", metavar="CKPT", help="gptlab checkpoint (or run directory) to export")
    which.add_argument(
        "--consolidate",
        metavar="RUN",
        help="sharded (FSDP) checkpoint or run directory to gather into one file",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (must be new or empty)")
    p.set_defaults(func=run)


def _fresh(out: Path) -> Path:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GptlabError(f"{out}: already exists and is not an empty directory; choose a new --out")
    return out


def run(args: argparse.Namespace) -> int:
    """Dispatch on the direction; both report what was written on one line."""
    directions = {"from_hf": _from_hf, "to_hf": _to_hf, "consolidate": _consolidate}
    name = next(k for k in directions if getattr(args, k) is not None)
    return directions[name](Path(getattr(args, name)), _fresh(Path(args.out)))


def _from_hf(source: Path, out: Path) -> int:
    from gptlab.checkpoint import save
    from gptlab.interop.hf import from_hf, tokenizer_from_hf

    model = from_hf(source)
    tokenizer = tokenizer_from_hf(source)
    save(model, tokenizer, out)
    tok = (
        "with its GPT-2 tokenizer"
        if tokenizer is not None
        else "no tokenizer (vocab.json + merges.txt not found)"
    )
    print(f"wrote gptlab checkpoint {out} ({_describe(model)}; {tok})")
    return 0


def _to_hf(source: Path, out: Path) -> int:
    from gptlab.checkpoint import load
    from gptlab.interop.hf import export_family, to_hf

    model, _ = load(source)
    family = export_family(model.config)
    to_hf(model, out)
    print(
        f"wrote Hugging Face {family.architecture} directory {out} ({_describe(model)}; "
        f"load it with transformers.AutoModelForCausalLM.from_pretrained)"
    )
    return 0


def _consolidate(source: Path, out: Path) -> int:
    from gptlab.checkpoint.sharded import consolidate

    print(f"wrote gptlab checkpoint {consolidate(source, out)} (gathered from the shards of {source})")
    return 0


def _describe(model: Any) -> str:
    c = model.config
    return f"{c.n_layer} layers, d_model {c.n_embd}, {model.num_params()['total']:,} parameters"
