"""Tokenizers: text -> token ids -> text (blueprint stage 1, "Text to Tokens").

    T: Σ* -> {0, 1, ..., V-1}*,    tokenize(s) = [vocab[τ_i] | τ_i ∈ BPE_segment(s, M)]

- ``CharTokenizer``: one id per character of a corpus.
- ``BPETokenizer``: byte-level BPE trained from scratch (``BPETokenizer.train``).
- ``GPT2Tokenizer``: exact GPT-2 ids from ``vocab.bpe`` + ``encoder.json``.
- ``PretrainedTokenizer``: a pretrained model's own byte-level BPE (from GGUF metadata or
  ``tokenizer.json``), with its special tokens, bos/eos and chat template (``chat.py`` renders it).

Every tokenizer saves to JSON (``tok.save(path)``) and comes back with ``load``.
No torch here: this package imports without it.

    >>> tok = CharTokenizer.from_text("hello")
    >>> from_dict(tok.to_dict()).encode("hello") == tok.encode("hello")
    True
"""

from gptlab.tokenizers.base import EOT, KINDS, Tokenizer, from_dict
from gptlab.tokenizers.bpe import BPETokenizer
from gptlab.tokenizers.char import CharTokenizer
from gptlab.tokenizers.gpt2 import GPT2Tokenizer
from gptlab.tokenizers.loading import load, read_corpus
from gptlab.tokenizers.patterns import PATTERNS
from gptlab.tokenizers.pretrained import PretrainedTokenizer

__all__ = [
    "EOT",
    "KINDS",
    "PATTERNS",
    "BPETokenizer",
    "CharTokenizer",
    "GPT2Tokenizer",
    "PretrainedTokenizer",
    "Tokenizer",
    "from_dict",
    "load",
    "read_corpus",
]
