"""``to_gguf``: a gptlab decoder + its tokenizer → one GGUF file that llama.cpp (and ollama, LM Studio) runs.

    gptlab.to_gguf(model, "model.gguf", tokenizer, type="q8_0")   # + an ollama Modelfile beside it

The file is written with the ``gguf`` package (llama.cpp's ``GGUFWriter``) and its tensors are
quantized with ``gguf.quants.quantize``: no format code here. The architecture is the llama.cpp one
that computes the model's function (``gguf_arch.EXPORTS``); the tokenizer becomes metadata llama.cpp
tokenizes to the same ids (``gguf_vocab``).

``type`` (``TYPES``) is the storage of the matrices. As llama.cpp's ``convert_hf_to_gguf.py`` does,
1-D tensors (norm weights, biases) stay F32 whatever ``type``, and a matrix whose rows are not a
whole number of quantization blocks (32 weights for Q8_0 and Q4_0) falls back to F16. A Q8_0 block
is ``w_j = d·q_j`` with ``q_j ∈ [−127, 127]`` and one F16 scale ``d`` per 32 weights.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType
from gguf.quants import QuantError, quantize

from gptlab.checkpoint import model_state
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write
from gptlab.interop.gguf_arch import XIELU_ONE, XIELU_ZERO, ExportArch, choose
from gptlab.interop.gguf_vocab import Vocab, vocab_of, write
from gptlab.interop.modelfile import write_modelfile
from gptlab.model import GPT, GPTConfig
from gptlab.tokenizers import Tokenizer

#: --type → (storage of the matrices, the file type recorded in ``general.file_type``).
TYPES: dict[str, tuple[GGMLQuantizationType, LlamaFileType]] = {
    "f32": (GGMLQuantizationType.F32, LlamaFileType.ALL_F32),
    "f16": (GGMLQuantizationType.F16, LlamaFileType.MOSTLY_F16),
    "bf16": (GGMLQuantizationType.BF16, LlamaFileType.MOSTLY_BF16),
    "q8_0": (GGMLQuantizationType.Q8_0, LlamaFileType.MOSTLY_Q8_0),
    "q4_0": (GGMLQuantizationType.Q4_0, LlamaFileType.MOSTLY_Q4_0),
}
FALLBACK = GGMLQuantizationType.F16


def gguf_tensors(model: GPT, arch: ExportArch) -> dict[str, np.ndarray]:
    """Every tensor llama.cpp loads, float32, under its GGUF name (numpy shape = PyTorch's)."""
    cfg = model.config
    state = {k: v.detach().to("cpu", torch.float32).numpy() for k, v in model_state(model).items()}
    if cfg.tie_embeddings and arch.untied_head:
        state["lm_head.weight"] = state["wte.weight"]
    out: dict[str, np.ndarray] = {}
    used: set[str] = set()
    for ours, theirs, convert in arch.tensors:
        for i in range(cfg.n_layer) if "{i}" in ours else (0,):
            name = ours.format(i=i)
            if name not in state:
                continue
            used.add(name)
            for target, tensor in zip(theirs, convert(state[name], cfg), strict=True):
                out[target.format(i=i)] = np.ascontiguousarray(tensor, dtype=np.float32)
    left = sorted(set(state) - used)
    if left:  # a bug, not bad input: every tensor of an exportable model has a GGUF name
        raise AssertionError(f"no {arch.name} GGUF name for {', '.join(left)}")
    for bias, weight in arch.zero_bias:
        for i in range(cfg.n_layer) if "{i}" in bias else (0,):
            if bias.format(i=i) not in out:
                out[bias.format(i=i)] = np.zeros(out[weight.format(i=i)].shape[0], dtype=np.float32)
    return out


def storage(
    name: str, tensor: np.ndarray, qtype: GGMLQuantizationType
) -> tuple[np.ndarray, GGMLQuantizationType]:
    """``tensor`` encoded for the file: 1-D and norm tensors F32, a matrix in ``qtype`` (F16 if its rows
    do not fill whole blocks), as llama.cpp's converter decides."""
    if tensor.ndim <= 1 or name.endswith("_norm.weight"):
        return tensor, GGMLQuantizationType.F32
    if qtype == GGMLQuantizationType.F32:
        return tensor, qtype
    try:
        return quantize(tensor, qtype), qtype
    except QuantError:
        return quantize(tensor, FALLBACK), FALLBACK


def _hparams(writer: GGUFWriter, cfg: GPTConfig, arch: ExportArch, vocab: Vocab) -> None:
    """The architecture's keys: shapes, ε, RoPE base and rotated dimensions (the whole head)."""
    writer.add_context_length(cfg.block_size)
    writer.add_embedding_length(cfg.n_embd)
    writer.add_block_count(cfg.n_layer)
    assert cfg.d_ff is not None and cfg.n_kv_head is not None
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_kv_head)
    writer.add_vocab_size(len(vocab.tokens))
    if arch.rope:
        writer.add_layer_norm_rms_eps(cfg.norm_eps)
        writer.add_rope_freq_base(cfg.rope_theta)
        writer.add_rope_dimension_count(cfg.head_dim)
        writer.add_key_length(cfg.head_dim)
        writer.add_value_length(cfg.head_dim)
    else:
        writer.add_layer_norm_eps(cfg.norm_eps)
    if arch.xielu:  # ReLU² as xIELU: α_p = softplus(XIELU_ONE) = 1, α_n = β = 0 (gguf_arch)
        for key, value in (("alpha_p", XIELU_ONE), ("alpha_n", XIELU_ZERO), ("beta", 0.0), ("eps", 0.0)):
            writer.add_array(f"xielu.{key}", [value] * cfg.n_layer)  # llama.cpp's keys, one value per layer


def check_exportable(model: GPT, tokenizer: Tokenizer | None) -> ExportArch:
    """The llama.cpp architecture for ``model``, or a ``GptlabError`` saying why it cannot be exported."""
    if not isinstance(model, GPT):
        raise GptlabError(f"to_gguf needs a gptlab GPT model, got {type(model).__name__}")
    if getattr(model, "quantization", None) not in (None, "fp32"):
        raise GptlabError(
            f"a {model.quantization} inference model cannot be exported; export the float checkpoint "
            "and choose --type q8_0 or q4_0 instead"
        )
    if tokenizer is None:
        raise GptlabError(
            "the model has no tokenizer; a GGUF file carries one, so export a checkpoint saved with it"
        )
    return choose(model.config)


def to_gguf(
    model: GPT,
    path: str | os.PathLike[str],
    tokenizer: Tokenizer | None,
    type: str = "f32",  # noqa: A002 - the CLI's --type
    modelfile: bool = True,
    name: str | None = None,
) -> Path:
    """Write ``model`` and ``tokenizer`` as a GGUF file (atomically) and, if ``modelfile``, an ollama
    ``Modelfile`` beside it. Returns the path of the ``.gguf`` file.

    A model with no exact llama.cpp architecture, a tokenizer llama.cpp cannot reproduce, or an
    unknown ``type`` is a ``GptlabError`` naming what to change.
    """
    if type not in TYPES:
        raise GptlabError(f"unknown GGUF type {type!r}; choose one of {', '.join(TYPES)}")
    arch = check_exportable(model, tokenizer)
    assert tokenizer is not None
    cfg = model.config
    vocab = vocab_of(tokenizer, cfg.vocab_size)
    qtype, file_type = TYPES[type]
    path = Path(path)
    if path.is_dir():
        raise GptlabError(f"{path}: is a directory; to_gguf writes one file, e.g. {path / 'model.gguf'}")
    title = name or str(cfg.extra.get("gguf_name") or path.stem)
    tensors = gguf_tensors(model, arch)

    def write_file(tmp: Path) -> None:
        writer = GGUFWriter(tmp, arch.name)
        writer.add_name(title)
        writer.add_file_type(int(file_type))
        _hparams(writer, cfg, arch, vocab)
        write(writer, vocab)
        for tensor_name, tensor in tensors.items():
            data, kind = storage(tensor_name, tensor, qtype)
            writer.add_tensor(tensor_name, data, raw_dtype=kind)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()

    atomic_write(path, write_file)
    if modelfile:
        write_modelfile(path, vocab, cfg.block_size)
    return path


__all__ = ["TYPES", "check_exportable", "gguf_tensors", "storage", "to_gguf"]
