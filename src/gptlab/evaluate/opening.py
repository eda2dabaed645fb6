"""Open any model gptlab reads for scoring: a checkpoint or run directory (LoRA runs merged, int8 kept),
a Hugging Face folder, a GGUF file, or ``smollm2`` (the packaged GGUF file), in the weight format asked.

    fp32                  the plain float32 model
    bf16 | int8           as ``gptlab.quantize`` makes them (bf16 on a CPU: bf16 matrices, float32 math)
    auto                  an int8 checkpoint stays int8; otherwise what ``gptlab.hardware.inference_weights``
                          picks for several sequences at once
"""

from __future__ import annotations

from gptlab.errors import GptlabError
from gptlab.model import GPT
from gptlab.tokenizers.base import Tokenizer

#: lm-eval's and torch's spellings of the weight formats → gptlab's.
FORMATS: dict[str, str] = {
    "auto": "auto",
    "fp32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "int8": "int8",
}


def weight_format(dtype: str, device: str, stored: str | None) -> str:
    """``dtype`` (any spelling in ``FORMATS``) → fp32, bf16 or int8 for a model stored as ``stored``."""
    from gptlab.hardware import inference_weights

    fmt = FORMATS.get(str(dtype).lower())
    if fmt is None:
        raise GptlabError(f"dtype={dtype!r} is not a weight format; use one of {', '.join(FORMATS)}")
    if stored is not None:
        if fmt not in ("auto", stored):
            raise GptlabError(f"the checkpoint holds {stored} weights; use dtype={stored} (or auto)")
        return stored
    return inference_weights(device, sequences=8) if fmt == "auto" else fmt


def open_model(spec: str, dtype: str = "fp32", device: str = "cpu") -> tuple[GPT, Tokenizer]:
    """``(model in eval mode, tokenizer)`` for ``spec``; a model without a tokenizer is one error."""
    import gptlab
    from gptlab.checkpoint import stored_format
    from gptlab.sources import load_source, resolve_source, source_kind

    path = resolve_source(spec)
    if source_kind(path) == "gptlab":
        fmt = weight_format(dtype, device, stored_format(path))
        model, tokenizer = gptlab.load(path, device=device, quantize=None if fmt == "fp32" else fmt)
    else:  # a Hugging Face folder or a GGUF file: read in float32, then converted
        fmt = weight_format(dtype, device, None)
        model, tokenizer = load_source(path)
        model = model.to(device)
    if tokenizer is None:
        raise GptlabError(f"{spec}: the model has no tokenizer; scoring text needs one")
    from gptlab.generate.driver import check_generative

    check_generative(model, str(spec))
    # fp32 stays the plain model: scoring runs wide batches (no one-row kernels to gain), and generation
    # with the plain layers is faster here than with the inference layers of gptlab.quantize
    return (model.float() if fmt == "fp32" else gptlab.quantize(model, fmt)).eval(), tokenizer
