"""Opening any model: a checkpoint or run directory, a LoRA run, a Hugging Face folder or a GGUF file.

    model, tokenizer = load(SRC, quantize="bf16")   # any of them, for inference, in the format asked
    model, tokenizer = load_source(SRC)             # any of them, in float32 (to train or export)

``SRC`` is a gptlab checkpoint or run directory, a Hugging Face model folder, or a GGUF file
(``SOURCES``); a short name of a GGUF file that a package carries (``smollm2``) names that file. Every
command that takes a model opens it here, so each takes every kind of source, and a source that is
none of them is the same one-line error (``source_kind``) everywhere. A
LoRA run holds only its adapters and a reference to its base (``gptlab.checkpoint.lora``); ``load``
reads the base (itself any source), checks its sha256, re-applies the adapters and merges them
(``W ← W + (α/r)·B·A``), so every command that loads a checkpoint accepts a LoRA run and sees a plain
model. This module sits above ``checkpoint`` and ``interop`` because it dispatches to both.
"""

from __future__ import annotations

import hashlib
import importlib
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gptlab import checkpoint
from gptlab.checkpoint import kept
from gptlab.checkpoint import lora as lora_files
from gptlab.errors import GptlabError
from gptlab.model import GPT
from gptlab.model.lora import apply_lora, load_adapter_state, merge_lora
from gptlab.model.warmup import warm_up
from gptlab.model.weight_formats import quantize as quantize_model

if TYPE_CHECKING:
    from gptlab.model.config import GPTConfig
    from gptlab.tokenizers.base import Tokenizer

PathLike = str | os.PathLike[str]
SKIP_HASH = ("train_state",)  # a training checkpoint's optimizer state is not part of the weights
#: the short names a missing source is told about
NAMES_HINT = " (or a packaged model's short name: smollm2)"


def is_gptlab(path: Path) -> bool:
    """True for a gptlab checkpoint directory, or a run directory holding checkpoints."""
    if (path / checkpoint.CONFIG_FILE).is_file():
        data = checkpoint.read_json(path / checkpoint.CONFIG_FILE)
        return isinstance(data, dict) and "gptlab_format" in data
    return bool(checkpoint.list_checkpoints(path))


def gguf_module() -> Any:
    """``gptlab.interop.gguf``, or a ``GptlabError`` saying what is missing (the gguf package)."""
    try:
        return importlib.import_module("gptlab.interop.gguf")
    except ModuleNotFoundError as exc:
        if exc.name not in ("gptlab.interop.gguf", "gguf"):
            raise
        raise GptlabError(
            f"reading GGUF files needs gptlab.interop.gguf and the gguf package ({exc.name} is missing)"
        ) from None


def source_path(src: PathLike) -> Path:
    """``src`` as a path; a short name of a GGUF file that a package carries (``smollm2``) that names
    nothing here becomes that file (``gptlab.interop.gguf.resolve``). An existing path always wins."""
    path = Path(src)
    if path.exists():
        return path
    try:
        gguf = gguf_module()
    except GptlabError:  # no GGUF support here, so no short names either
        return path
    return Path(gguf.resolve(path))


def source_kind(src: PathLike) -> str:
    """``gguf`` (a ``.gguf`` file), ``gptlab`` (checkpoint or run directory) or ``hf`` (a folder with config.json)."""
    path = source_path(src)
    if not path.exists():
        raise GptlabError(
            f"{src}: no such checkpoint, run directory, Hugging Face folder or GGUF file{NAMES_HINT}"
        )
    if path.is_file() and path.suffix.lower() == ".gguf":
        return "gguf"
    if path.is_dir() and is_gptlab(path):
        return "gptlab"
    if path.is_dir() and (path / "config.json").is_file():
        return "hf"
    raise GptlabError(
        f"{src}: not a gptlab checkpoint or run directory, a Hugging Face folder (config.json) or a .gguf file"
    )


def is_model_source(spec: str) -> bool:
    """True when ``spec`` names a model that carries a tokenizer (for ``prepare --tokenizer SRC``)."""
    try:
        source_kind(spec)
    except GptlabError:
        return False
    return True


def load_gptlab(path: Path) -> tuple[GPT, Tokenizer | None]:
    """A gptlab checkpoint, run or LoRA run in float (int8/int4 inference weights are refused: nothing
    to train)."""
    stored = checkpoint.stored_format(path)
    if stored is not None:  # int8 or int4 inference weights: nothing to train, adapt or export
        raise GptlabError(
            f"{path}: holds {stored} inference weights, which cannot be trained; start from the float "
            "checkpoint (for QLoRA-like fine-tuning: lora with base_format int8 on the float checkpoint)"
        )
    return load(path)


def load_hf(path: Path) -> tuple[GPT, Tokenizer | None]:
    from gptlab.interop.hf import from_hf, tokenizer_from_hf

    return from_hf(path), tokenizer_from_hf(path)


def load_gguf(path: Path) -> tuple[GPT, Tokenizer | None]:
    gguf = gguf_module()
    return gguf.from_gguf(path), gguf.tokenizer_from_gguf(path)


def load_gguf_as(
    path: Path,
    device: str | torch.device,
    dtype: torch.dtype | None,
    quantize: str | None,
    store: str | os.PathLike[str] | None = None,
) -> tuple[GPT, Tokenizer | None]:
    """``load`` of a GGUF file: kept as it ships (``quantize`` None or ``"keep"``) on a CPU, else as asked.
    With a ``store``, the kept (or int4) conversion is read from there once it has been made
    (``gptlab.checkpoint.kept``)."""
    cpu = torch.device(device).type == "cpu"
    if quantize in (None, "keep") and (dtype is not None or not cpu):
        quantize = None  # a float dtype, or another device: float weights
    elif quantize in (None, "keep"):
        quantize = "keep"
    if quantize not in (None, "fp32") and not cpu:
        raise GptlabError(
            f"{path}: {quantize} weights run on the CPU; load it with --device cpu or as fp32/bf16"
        )
    streamed = quantize if quantize not in (None, "fp32") else None
    entry = (
        kept.entry_for(path, streamed, store) if store is not None and streamed in ("keep", "int4") else None
    )
    stored = kept.read_entry(entry) if entry is not None else None
    if stored is not None:
        return stored  # the gguf package never imported
    gguf = gguf_module()
    f = gguf.read_gguf(path)  # parsed once for both (its metadata holds the whole vocabulary)
    if streamed in ("keep", "int4"):
        from gptlab.interop.gguf_kept import from_gguf_kept

        model = from_gguf_kept(f, streamed)
        if entry is not None and getattr(model, "quantization", None) in ("int4", "int8"):
            tokenizer = gguf.tokenizer_from_gguf(f)
            kept.keep(model, tokenizer, entry)  # what converting cost is paid once
            return model, tokenizer
    else:
        model = gguf.from_gguf(f, dtype=dtype if streamed is None else None, quantize=streamed)
    if streamed is None:
        model = model.to(device)
    if quantize == "fp32" or (quantize == "keep" and getattr(model, "quantization", None) is None):
        quantize_model(model, "fp32")  # (keep of a float-only file) as a checkpoint's load(quantize="fp32")
    return model, gguf.tokenizer_from_gguf(f)


#: Source kind → reader returning ``(model in float32, tokenizer or None)``.
SOURCES: dict[str, Callable[[Path], tuple[GPT, Tokenizer | None]]] = {
    "gptlab": load_gptlab,
    "hf": load_hf,
    "gguf": load_gguf,
}


def resolve_source(src: PathLike) -> Path:
    """The exact weights ``src`` names: a run directory resolves to its latest checkpoint."""
    path = source_path(src).resolve()
    return checkpoint.resolve_checkpoint(path) if source_kind(path) == "gptlab" else path


def source_config(src: PathLike) -> GPTConfig:
    """The ``GPTConfig`` a source runs with, read without its weights: a checkpoint's (or a run's
    latest checkpoint's) ``config.json`` at the context it runs at (``usable_config``; a LoRA
    checkpoint's base's), a Hugging Face ``config.json``, a GGUF file's metadata."""
    path = source_path(src)
    kind = source_kind(path)
    if kind == "gptlab":
        directory = checkpoint.resolve_checkpoint(path)
        base = (
            lora_files.read_spec(directory).base.get("path")
            if lora_files.is_lora_checkpoint(directory)
            else None
        )
        if base and Path(base).exists():  # adapters run merged into their base: its config
            return source_config(base)
        return checkpoint.usable_config(directory / checkpoint.CONFIG_FILE)
    if kind == "hf":
        from gptlab.interop.hf import hf_config_to_gptlab

        return hf_config_to_gptlab(path)
    gguf = gguf_module()
    config: GPTConfig = gguf.gguf_config(gguf.read_gguf(path))[2]
    return config


def load_source(src: PathLike) -> tuple[GPT, Tokenizer | None]:
    """``(model, tokenizer)`` from a gptlab checkpoint/run, a Hugging Face folder or a GGUF file."""
    path = source_path(src)
    model, tokenizer = SOURCES[source_kind(path)](path)
    return model.float(), tokenizer


def source_tokenizer(src: PathLike) -> Tokenizer:
    """The tokenizer that comes with a model (``prepare --tokenizer SRC``)."""
    path = source_path(src)
    kind = source_kind(path)
    if kind == "gptlab":
        tok = checkpoint.load_tokenizer(checkpoint.resolve_checkpoint(path))
    else:
        tok = gguf_module().tokenizer_from_gguf(path) if kind == "gguf" else SOURCES[kind](path)[1]
    if tok is None:
        raise GptlabError(f"{src}: this model carries no tokenizer gptlab can read")
    return tok


def model_tokenizer(spec: str) -> Tokenizer | None:
    """The tokenizer of the model ``spec`` names, or None when ``spec`` names no model
    (``gptlab.data.prepare``'s ``model_tokenizer``: ``prepare --tokenizer SRC``)."""
    return source_tokenizer(spec) if is_model_source(spec) else None


def source_sha256(src: PathLike) -> str:
    """sha256 of a source's content: the file itself, or a folder's files (names and bytes, sorted)."""
    path = resolve_source(src)
    h = hashlib.sha256()
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    for p in files:
        if p.name.startswith(SKIP_HASH):
            continue
        h.update(p.name.encode() + b"\0")
        with open(p, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
    return h.hexdigest()


def load_merged(
    directory: PathLike, device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> tuple[GPT, Tokenizer | None]:
    """A LoRA checkpoint's base with the adapters merged in (float32 while merging), as a plain ``GPT``."""
    directory = Path(directory)
    spec = lora_files.read_spec(directory)
    base_path = spec.base.get("path")
    if not base_path or not Path(base_path).exists():
        raise GptlabError(
            f"{directory}: the base model of these adapters ({base_path}) is missing; "
            f"restore it at that path to load the run"
        )
    lora_files.check_base(spec, source_sha256(base_path), directory)
    model, _ = load_source(base_path)
    model.float()
    float_spec = type(spec).from_dict({**spec.to_dict(), "base_format": "float32", "dropout": 0.0})
    apply_lora(model, float_spec)
    adapters = directory / lora_files.ADAPTERS_FILE
    load_adapter_state(model, checkpoint.read_tensors(adapters), str(adapters))
    merge_lora(model)
    for p in model.parameters():
        p.requires_grad_(True)
    if dtype is not None:
        model.to(dtype=dtype)
    tokenizer = checkpoint.load_tokenizer(directory)
    checkpoint.check_tokenizer_fits(tokenizer, model.config.vocab_size, directory / checkpoint.TOKENIZER_FILE)
    return model.to(device).eval(), tokenizer


def stored_format(src: PathLike) -> str | None:
    """``"int8"`` for a gptlab checkpoint saved in int8, else None (float weights: a float checkpoint, a
    Hugging Face folder, a GGUF file, whose tensors are read as floats). A bad source is ``source_kind``'s error."""
    path = source_path(src)
    return checkpoint.stored_format(path) if source_kind(path) == "gptlab" else None


def _streams(path: Path, kind: str) -> bool:
    """True when an imported source can be converted tensor by tensor while read (not gptlab's own
    remote-code Hugging Face export, which is read back whole)."""
    if kind == "gguf":
        return True
    from gptlab.interop.hf_remote import MODEL_TYPE

    data = checkpoint.read_json(path / "config.json")
    return not (isinstance(data, dict) and data.get("model_type") == MODEL_TYPE)


def load_imported(
    path: Path,
    kind: str,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    quantize: str | None = None,
) -> tuple[GPT, Tokenizer | None]:
    """A Hugging Face folder or a GGUF file for inference, as ``load`` gives a checkpoint: in the format
    ``quantize`` asks, converted tensor by tensor while read on a CPU (bf16, int8), so no float32 copy
    of the whole model is made; otherwise read in float32, then moved, cast and converted."""
    from gptlab.model.load_quantized import STREAMED

    cpu = torch.device(device).type == "cpu"
    streamed = quantize in STREAMED and cpu and dtype is None and _streams(path, kind)
    if kind == "gguf":
        gguf = gguf_module()
        parsed = gguf.read_gguf(path)  # parsed once for the weights and the tokenizer
        model = gguf.from_gguf(parsed, quantize=quantize if streamed else None)
        tokenizer = gguf.tokenizer_from_gguf(parsed)
    else:
        from gptlab.interop.hf import from_hf, tokenizer_from_hf

        model = from_hf(path, quantize=quantize if streamed else None)
        tokenizer = tokenizer_from_hf(path)
    if not streamed:
        model = model.to(device)
        if dtype is not None:
            model.to(dtype=dtype)
        if quantize:
            quantize_model(model, quantize)  # in place
    checkpoint.check_tokenizer_fits(tokenizer, model.config.vocab_size, path)
    return model.eval(), tokenizer


def load(
    path: PathLike,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    quantize: str | None = None,
    store: str | os.PathLike[str] | None = None,
) -> tuple[GPT, Tokenizer | None]:
    """``gptlab.load``: any source → ``(model, tokenizer_or_None)`` in eval mode: a checkpoint directory
    (or a run directory: its latest checkpoint; a LoRA run's adapters merged into their base), a Hugging
    Face folder, a GGUF file, or a packaged short name (``smollm2``).

    ``quantize`` (``"fp32"``, ``"bf16"``, ``"int8"``, ``"int4"``): the model for inference in that format
    (``gptlab.checkpoint.load``; an imported model is converted as it is read, ``load_imported``).
    A GGUF file (or ``smollm2``) loads as llama.cpp runs it: its Q4_0/Q4_1 matrices int4 and its other
    quantized ones int8 (``quantize`` None or ``"keep"``, on the CPU, ``load_gguf_as``);
    ``quantize="fp32"`` asks for float32 weights (dequantized), the other formats convert to that format. On a
    CPU whose decode multiplies one row through the compiled kernel (``gptlab.hardware.one_row_kernel``:
    below native bf16), that kernel is then compiled before the model is returned
    (``gptlab.model.warmup``), so the first prefill and decode step cost what the later ones do; where
    the library kernels serve, or no layer streams (int4), nothing compiles and the compiler is never
    imported.

    ``store`` (a folder; the CLI's ``--weights-cache``): a GGUF file's conversion into int4/int8
    layers, and a float32 checkpoint's bf16 copy where it is loaded as bf16 on the CPU
    (``load_kept_bf16``), are kept there the first time and read from there afterwards
    (``gptlab.checkpoint.kept``).
    """
    src = source_path(path)
    kind = source_kind(src)
    if kind == "gptlab":
        src = checkpoint.resolve_checkpoint(src)
    model, tokenizer = _load(src, kind, device, dtype, quantize, store)
    if getattr(model, "quantization", None) is not None:  # inference weights, however they were chosen
        warm_up(model)  # (a format asked for, a quantized checkpoint, a GGUF file kept as it ships)
    return model, tokenizer


def _load(
    src: Path,
    kind: str,
    device: str | torch.device,
    dtype: torch.dtype | None,
    quantize: str | None,
    store: str | os.PathLike[str] | None = None,
) -> tuple[GPT, Tokenizer | None]:
    if kind == "gguf":
        return load_gguf_as(src, device, dtype, quantize, store)
    if kind != "gptlab":
        return load_imported(src, kind, device, dtype, quantize)
    if lora_files.is_lora_checkpoint(src):  # the one place LoRA adapters are merged on load
        checkpoint.verify_checksums(src)
        model, tokenizer = load_merged(src, device, dtype)
        if quantize:
            quantize_model(model, quantize)  # in place
        return model, tokenizer
    if quantize == "bf16" and store is not None and dtype is None and torch.device(device).type == "cpu":
        return load_kept_bf16(src, store)
    return checkpoint.load(src, device, dtype, quantize)


def load_kept_bf16(src: Path, store: str | os.PathLike[str]) -> tuple[GPT, Tokenizer | None]:
    """A float checkpoint run in bf16 on the CPU, through its bf16 copy kept in ``store``: read from
    there (half the bytes to read and check, no cast), else made there first (once: the checkpoint
    read, cast to bf16 and saved), then read. A bf16 checkpoint needs no copy: it is read as it is."""
    entry = kept.entry_for(src, "bf16", store)
    found = kept.read_entry(entry, quantize="bf16")
    if found is not None:
        return found
    if checkpoint.stored_format(src) is None and not _holds_bf16(src):
        model, tokenizer = checkpoint.load(src, dtype=torch.bfloat16)
        if kept.keep(model, tokenizer, entry):
            del model
            found = kept.read_entry(entry, quantize="bf16")
            if found is not None:
                return found
    return checkpoint.load(src, quantize="bf16")


def _holds_bf16(src: Path) -> bool:
    """Whether a checkpoint's matrices are stored in bf16 already (its header says; nothing is read).
    No weights file: False, and reading the checkpoint says what is wrong with it."""
    from safetensors import safe_open

    weights = src / checkpoint.WEIGHTS_FILE
    if not weights.is_file():
        return False
    with safe_open(str(weights), framework="pt") as f:
        return all(f.get_slice(name).get_dtype() == "BF16" for name in f.keys() if name.endswith(".weight"))


__all__ = [
    "SOURCES",
    "gguf_module",
    "is_gptlab",
    "is_model_source",
    "load",
    "load_gguf",
    "load_gptlab",
    "load_hf",
    "load_imported",
    "load_merged",
    "load_source",
    "model_tokenizer",
    "resolve_source",
    "source_kind",
    "source_path",
    "source_sha256",
    "source_tokenizer",
    "stored_format",
]
