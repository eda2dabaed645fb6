"""Interoperability, offline: Hugging Face transformers directories (``from_hf``/``to_hf``, no transformers
import; GPT-2, Llama and Qwen3 natively, every other model as a remote-code folder generated from
``gptlab.model``) and llama.cpp's GGUF files (``from_gguf``, ``tokenizer_from_gguf``, read with the
``gguf`` package; ``to_gguf`` writes one with its ``GGUFWriter``).

Imported lazily, as ``gptlab`` is: reading a GGUF file's kept conversion, or resolving the name
``smollm2``, imports neither the ``gguf`` package nor the Hugging Face exporters.
"""

from __future__ import annotations

from gptlab.lazy import lazy_names

_LAZY = {
    "FAMILIES": ("gptlab.interop.hf", "FAMILIES"),
    "export_family": ("gptlab.interop.hf", "export_family"),
    "from_hf": ("gptlab.interop.hf", "from_hf"),
    "to_hf": ("gptlab.interop.hf", "to_hf"),
    "tokenizer_from_hf": ("gptlab.interop.hf", "tokenizer_from_hf"),
    "from_gguf": ("gptlab.interop.gguf", "from_gguf"),
    "tokenizer_from_gguf": ("gptlab.interop.gguf", "tokenizer_from_gguf"),
    "to_gguf": ("gptlab.interop.gguf_export", "to_gguf"),
}


__getattr__, __dir__ = lazy_names("gptlab.interop", _LAZY, globals())


__all__ = sorted(_LAZY)
