"""Interoperability, offline: Hugging Face transformers directories (``from_hf``/``to_hf``, no transformers
import; GPT-2, Llama and Qwen3 natively, every other model as a remote-code folder generated from
``gptlab.model``) and llama.cpp's GGUF files (``from_gguf``, ``tokenizer_from_gguf``, read with the
``gguf`` package)."""

from gptlab.interop.gguf import from_gguf, tokenizer_from_gguf
from gptlab.interop.hf import FAMILIES, export_family, from_hf, to_hf, tokenizer_from_hf

__all__ = [
    "FAMILIES",
    "export_family",
    "from_gguf",
    "from_hf",
    "to_hf",
    "tokenizer_from_gguf",
    "tokenizer_from_hf",
]
