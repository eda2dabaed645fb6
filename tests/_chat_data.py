"""What the chat, preference and DPO data tests share: a character vocabulary with ChatML's special
tokens, and a JSONL writer (a record that is a string is written as it is, to make a bad line)."""

from __future__ import annotations

import json

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ALPHABET = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,:;?!'-\n"


def write_jsonl(path, records):
    """``records``, one JSON object (or raw string) per line, to ``path``; returns ``path``."""
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path
