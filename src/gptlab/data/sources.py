"""Corpus sources: the files behind a dataset, read as UTF-8 text in chunks that stream.

Inputs are text files, directories (searched recursively for ``*.txt``, ``*.md`` …)
or JSONL files with a ``text`` field. Each file (each JSONL line) is a document.
Files are read in chunks, so corpora larger than memory stream through.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gptlab.errors import GptlabError

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text", ".jsonl")
CHUNK_BYTES = 1 << 20

PathLike = str | os.PathLike[str]


def find_sources(inputs: Sequence[PathLike]) -> list[Path]:
    """Files named directly, plus text files found recursively in named directories (sorted)."""
    if not inputs:
        raise GptlabError("no input given; name one or more text files, directories or JSONL files")
    found: list[Path] = []
    for item in inputs:
        path = Path(item)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in TEXT_SUFFIXES)
            if not files:
                raise GptlabError(f"{path}: directory holds no text files ({', '.join(TEXT_SUFFIXES)})")
            found.extend(files)
        elif path.is_file():
            found.append(path)
        else:
            raise GptlabError(f"{path}: no such file or directory")
    return list(dict.fromkeys(found))


def describe_sources(sources: Sequence[Path]) -> list[dict[str, Any]]:
    """``[{path, bytes, sha256}]`` for meta.json."""
    out = []
    for path in sources:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while block := f.read(CHUNK_BYTES):
                h.update(block)
        out.append({"path": str(path), "bytes": path.stat().st_size, "sha256": h.hexdigest()})
    return out


def _text_chunks(path: Path, chunk_bytes: int) -> Iterator[str]:
    """UTF-8 text of one file in pieces that end at a newline where possible.

    A NUL byte (binary file) or invalid UTF-8 is a ``GptlabError`` naming the file and byte offset.
    """
    decoder = codecs.getincrementaldecoder("utf-8")()
    offset, carry = 0, ""
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk_bytes)
            nul = block.find(b"\0")
            if nul >= 0:
                raise GptlabError(
                    f"{path}: looks like a binary file (NUL byte at offset {offset + nul}); "
                    f"give UTF-8 text files"
                )
            try:
                text = decoder.decode(block, final=not block)
            except UnicodeDecodeError as exc:
                pos = offset - len(decoder.getstate()[0]) + exc.start
                raise GptlabError(
                    f"{path}: not UTF-8 text (invalid byte at offset {max(pos, 0)}); "
                    f"convert it to UTF-8 first (e.g. iconv -f latin1 -t utf-8)"
                ) from None
            offset += len(block)
            text = carry + text
            if not block:
                if text:
                    yield text
                return
            cut = text.rfind("\n") + 1
            if cut == 0 and len(text) < 4 * chunk_bytes:
                carry = text
                continue
            cut = cut or len(text)
            carry = text[cut:]
            if cut:
                yield text[:cut]


def _jsonl_documents(path: Path) -> Iterator[str]:
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                record = json.loads(raw.decode("utf-8"))
            except UnicodeDecodeError:
                raise GptlabError(f"{path}: line {lineno} is not UTF-8") from None
            except json.JSONDecodeError as exc:
                raise GptlabError(f"{path}: line {lineno} is not valid JSON ({exc.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise GptlabError(
                    f'{path}: line {lineno} has no string field "text"; JSONL input needs '
                    f'one object per line like {{"text": "..."}}'
                )
            yield record["text"]


def iter_chunks(sources: Sequence[Path], chunk_bytes: int | None = None) -> Iterator[tuple[bool, str]]:
    """``(starts_document, text)`` pieces of every source, in order (``CHUNK_BYTES`` at a time by default)."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    for path in sources:
        if path.suffix.lower() == ".jsonl":
            for doc in _jsonl_documents(path):
                yield True, doc
        else:
            first = True
            for piece in _text_chunks(path, chunk_bytes):
                yield first, piece
                first = False


def count_documents(sources: Sequence[Path]) -> int:
    return sum(1 for start, _ in iter_chunks(sources) if start)
