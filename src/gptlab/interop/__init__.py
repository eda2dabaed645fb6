"""Interoperability with Hugging Face transformers: ``from_hf`` and ``to_hf`` (offline, no transformers import)."""

from gptlab.interop.hf import FAMILIES, export_family, from_hf, to_hf, tokenizer_from_hf

__all__ = ["FAMILIES", "export_family", "from_hf", "to_hf", "tokenizer_from_hf"]
