"""Exact GPT-2 tokenization from local files: ``vocab.bpe`` + ``encoder.json``.

The same ids as tiktoken's ``gpt2`` encoding, built offline from the two
standard files (or Hugging Face ``vocab.json`` + ``merges.txt``, or a
``.tiktoken`` rank file). Encoding is ``ranked.py``: the blueprint's
tokenize(s) = [vocab[τ_i] | τ_i ∈ BPE_segment(s, M)] with M the 50,000 merges of
``vocab.bpe`` and the GPT-2 split pattern.

    >>> tok = GPT2Tokenizer.from_dir("../shared/data/gpt2")  # doctest: +SKIP
    >>> tok.encode("Hello world"), tok.encode("The cat sat on")  # doctest: +SKIP
    ([15496, 995], [464, 3797, 3332, 319])

(The blueprint's figure gives 2415 for " cat"; the real GPT-2 id is 3797.)
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gptlab.errors import GptlabError
from gptlab.tokenizers.base import EOT
from gptlab.tokenizers.byte_unicode import byte_to_char, spelled_in_alphabet, token_to_bytes
from gptlab.tokenizers.ranked import RankedTokenizer

PathLike = str | os.PathLike[str]


def _read_text(path: PathLike, what: str) -> str:
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise GptlabError(f"{what} file {os.fspath(path)!r} does not exist") from None
    except IsADirectoryError:
        raise GptlabError(f"{what} file {os.fspath(path)!r} is a directory") from None
    except UnicodeDecodeError as exc:
        raise GptlabError(f"{what} file {os.fspath(path)!r} is not UTF-8 (byte {exc.start})") from None
    except OSError as exc:
        raise GptlabError(f"cannot read {what} file {os.fspath(path)!r}: {exc.strerror}") from None


def read_merges(path: PathLike) -> list[tuple[str, str]]:
    """``vocab.bpe`` / ``merges.txt`` -> ``[("Ġ", "t"), ...]`` (the ``#version`` line is skipped)."""
    merges = []
    for n, line in enumerate(_read_text(path, "merges").split("\n"), start=1):
        if not line or line.startswith("#version"):
            continue
        parts = line.split()
        if len(parts) != 2:
            raise GptlabError(
                f"{os.fspath(path)!r} line {n} is {line!r}; a merge line is two tokens separated by a space"
            )
        merges.append((parts[0], parts[1]))
    return merges


def ranks_from_merges(merges: list[tuple[str, str]]) -> dict[bytes, int]:
    """GPT-2's ranks: the 256 bytes in byte-table order, then one rank per merge (as tiktoken builds them)."""
    ranks = {bytes([b]): i for i, b in enumerate(byte_to_char())}
    for first, second in merges:
        token = token_to_bytes(first) + token_to_bytes(second)
        if token in ranks:
            raise GptlabError(f"the merge {first!r} {second!r} repeats an earlier token")
        ranks[token] = len(ranks)
    return ranks


def read_encoder(path: PathLike) -> dict[str, int]:
    """``encoder.json`` / ``vocab.json`` -> ``{"Ġcat": 3797, ...}``."""
    try:
        encoder = json.loads(_read_text(path, "encoder"))
    except json.JSONDecodeError as exc:
        raise GptlabError(f"{os.fspath(path)!r} is not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(encoder, dict) or not all(isinstance(v, int) for v in encoder.values()):
        raise GptlabError(f"{os.fspath(path)!r} must be a JSON object mapping token strings to int ids")
    return encoder


def read_tiktoken(path: PathLike) -> dict[bytes, int]:
    """A ``.tiktoken`` file (``base64(token) rank`` per line) -> ``{token bytes: rank}``."""
    ranks = {}
    for n, line in enumerate(_read_text(path, "tiktoken").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error):
            raise GptlabError(f"{os.fspath(path)!r} line {n} is not 'base64-token rank'") from None
    return ranks


class GPT2Tokenizer(RankedTokenizer):
    """GPT-2's byte-level BPE (or any tiktoken-style rank table) loaded from local files."""

    kind = "gpt2"

    def __init__(
        self,
        ranks: Mapping[bytes, int],
        pattern: str = "gpt2",
        special_tokens: Mapping[str, int] | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__(ranks, pattern, special_tokens, backend=backend)

    @classmethod
    def from_files(cls, vocab_bpe: PathLike, encoder_json: PathLike, backend: str = "auto") -> GPT2Tokenizer:
        """From GPT-2's ``vocab.bpe`` (merges) and ``encoder.json`` (token -> id).

        Hugging Face's ``merges.txt`` and ``vocab.json`` have the same formats.
        The two files must agree; ``encoder.json`` entries that are not merge
        results (``"<|endoftext|>"``) become the special tokens.
        """
        ranks = ranks_from_merges(read_merges(vocab_bpe))
        specials, matched = {}, 0
        for name, tid in read_encoder(encoder_json).items():
            data = spelled_in_alphabet(name)
            rank = None if data is None else ranks.get(data)
            if rank is None:
                specials[name] = tid
            elif rank != tid:
                raise GptlabError(
                    f"{os.fspath(encoder_json)!r} gives {name!r} the id {tid} but {os.fspath(vocab_bpe)!r} "
                    f"ranks it {rank}; the two files do not belong together"
                )
            else:
                matched += 1
        if matched != len(ranks):
            raise GptlabError(
                f"{os.fspath(encoder_json)!r} lacks {len(ranks) - matched} token(s) that {os.fspath(vocab_bpe)!r} "
                "merges into; the two files do not belong together"
            )
        return cls(ranks, "gpt2", specials, backend=backend)

    @classmethod
    def from_tiktoken(
        cls,
        path: PathLike,
        pattern: str = "gpt2",
        special_tokens: Mapping[str, int] | None = None,
        backend: str = "auto",
    ) -> GPT2Tokenizer:
        """From a ``.tiktoken`` rank file; special tokens default to ``<|endoftext|>`` after the last rank."""
        ranks = read_tiktoken(path)
        if not ranks:
            raise GptlabError(f"{os.fspath(path)!r} has no tokens")
        if special_tokens is None:
            special_tokens = {EOT: max(ranks.values()) + 1}
        return cls(ranks, pattern, special_tokens, backend=backend)

    @classmethod
    def from_dir(cls, directory: PathLike, backend: str = "auto") -> GPT2Tokenizer:
        """From a folder with ``vocab.bpe`` + ``encoder.json``, ``vocab.json`` + ``merges.txt``, or one ``*.tiktoken``."""
        d = Path(directory)
        if not d.is_dir():
            raise GptlabError(f"{os.fspath(directory)!r} is not a directory")
        for merges, encoder in (("vocab.bpe", "encoder.json"), ("merges.txt", "vocab.json")):
            if (d / merges).is_file() and (d / encoder).is_file():
                return cls.from_files(d / merges, d / encoder, backend=backend)
        rank_files = sorted(d.glob("*.tiktoken"))
        if len(rank_files) == 1:
            return cls.from_tiktoken(rank_files[0], backend=backend)
        raise GptlabError(
            f"{os.fspath(directory)!r} has no tokenizer files: expected vocab.bpe + encoder.json, "
            "vocab.json + merges.txt, or exactly one *.tiktoken file"
        )

    def _payload(self) -> dict[str, Any]:
        ranks = {base64.b64encode(token).decode("ascii"): rank for token, rank in self.ranks.items()}
        return {"pattern": self.pattern, "ranks": ranks}

    @classmethod
    def _from_payload(cls, d: Mapping[str, Any], special_tokens: dict[str, int]) -> GPT2Tokenizer:
        stored = d["ranks"]
        if not isinstance(stored, dict):
            raise GptlabError("'ranks' must be an object mapping base64 token bytes to ranks")
        try:
            ranks = {base64.b64decode(token, validate=True): rank for token, rank in stored.items()}
        except (binascii.Error, ValueError):
            raise GptlabError("'ranks' has a key that is not base64") from None
        if len(ranks) != len(stored):
            raise GptlabError("'ranks' has two keys for the same token bytes")
        return cls(ranks, d["pattern"], special_tokens)
