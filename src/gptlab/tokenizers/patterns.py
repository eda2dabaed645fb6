"""Pre-tokenisation split patterns, chosen by name.

Byte-level BPE never merges across the boundaries of the chunks these regexes cut
the text into, so a word keeps its leading space (``" cat"``) and digits,
punctuation and whitespace stay apart from letters. The patterns need the
``regex`` package (``\\p{L}``, possessive quantifiers), which tiktoken depends on.

    >>> split("Hello world's 123", "gpt2")
    ['Hello', ' world', "'s", ' 123']
    >>> split("Hello world's 12345", "gpt4")
    ['Hello', ' world', "'s", ' ', '123', '45']
"""

from __future__ import annotations

from functools import lru_cache

import regex

from gptlab.errors import GptlabError

# GPT-2, as tiktoken writes it for "gpt2"/"r50k_base". It splits exactly like
# openai/gpt-2's encoder.py pattern
#   '(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
# (the tests check this); the possessive quantifiers only make it faster.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""

# GPT-4 (tiktoken's "cl100k_base"): case-insensitive contractions, digits in
# groups of at most three, newlines kept apart from other whitespace.
GPT4_PATTERN = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|"""
    r"""\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)

# GPT-2's pattern after a first split into single digits (Hugging Face ``Digits(individual_digits=True)``
# then ``ByteLevel``; llama.cpp's "starcoder"/"smollm" pre-tokenizers). As one regex: digits stand
# alone, and a whitespace run before a digit is whole, as it is at the end of the first split's piece.
GPT2_DIGITS_PATTERN = (
    r"""\p{N}|'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?=\p{N})|\s+(?!\S)|\s"""
)

# Qwen2's: GPT-4's with single digits.
QWEN2_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)

PATTERNS: dict[str, str] = {
    "gpt2": GPT2_PATTERN,
    "gpt4": GPT4_PATTERN,
    "gpt2-digits": GPT2_DIGITS_PATTERN,
    "qwen2": QWEN2_PATTERN,
}


def resolve(pattern: str) -> str:
    """A pattern name from ``PATTERNS`` -> its regex; any other string is a custom regex.

    A custom regex is made total: text it does not match becomes one-character
    chunks (``(?:custom)|[\\s\\S]``), so no character is ever dropped and encoding
    stays lossless. The named patterns already match every character.

    >>> resolve("gpt2") == GPT2_PATTERN
    True
    >>> resolve(r"\\w+")
    '(?:\\\\w+)|[\\\\s\\\\S]'
    """
    if not isinstance(pattern, str) or not pattern:
        raise GptlabError(f"pattern must be one of {sorted(PATTERNS)} or a non-empty regex, got {pattern!r}")
    if pattern in PATTERNS:
        return PATTERNS[pattern]
    return f"(?:{pattern})|[\\s\\S]"


@lru_cache(maxsize=32)
def compile_pattern(pattern: str) -> regex.Pattern[str]:
    """Compile a pattern (name or regex); a bad regex is a ``GptlabError``."""
    source = resolve(pattern)
    try:
        compiled = regex.compile(source)
    except (regex.error, TypeError) as exc:
        raise GptlabError(
            f"the split pattern {pattern!r} is not a valid regex ({exc}); fix it or use one of {sorted(PATTERNS)}"
        ) from None
    if compiled.groups:
        raise GptlabError(
            f"the split pattern {pattern!r} has capturing groups; write (?:...) instead of (...)"
        )
    if compiled.fullmatch("") is not None:
        raise GptlabError(
            f"the split pattern {pattern!r} matches the empty string; every chunk must be non-empty"
        )
    return compiled


def split(text: str, pattern: str = "gpt4") -> list[str]:
    """Cut ``text`` into the chunks BPE works inside: ``"a b" -> ["a", " b"]``."""
    return compile_pattern(pattern).findall(text)
