"""Corpus sources: the files behind a dataset, their sizes and checksums, and their record formats.

Inputs are text files, directories (searched recursively for ``*.txt``, ``*.md`` …),
JSONL files with a ``text`` field, or parquet files with a ``text`` column (pyarrow).
Each file (each JSONL line, each parquet row) is a document. ``pieces.py`` cuts them into
pieces that stream (``CHUNK_BYTES`` of text, or a parquet row group, at a time).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gptlab.errors import GptlabError

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text", ".jsonl", ".parquet")
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
            files = sorted(
                p
                for p in path.rglob("*")
                if (p.is_file() or p.is_symlink()) and p.suffix.lower() in TEXT_SUFFIXES
            )
            if not files:
                raise GptlabError(f"{path}: directory holds no text files ({', '.join(TEXT_SUFFIXES)})")
            found.extend(files)
        elif path.is_file():
            found.append(path)
        else:
            raise GptlabError(f"{path}: no such file or directory")
    for path in found:  # an unreadable file (a broken link, no permission) fails before any work
        try:
            open(path, "rb").close()
        except OSError as exc:
            raise GptlabError(f"{path}: cannot be read ({exc.strerror or exc}); fix or remove it") from None
    return list(dict.fromkeys(found))


def source_bytes(path: Path) -> int:
    """Bytes of text a source holds, for progress: the file size, or a parquet ``text`` column's size."""
    if path.suffix.lower() != ".parquet":
        return path.stat().st_size
    meta = parquet_file(path).metadata
    col = meta.schema.names.index("text")
    return sum(meta.row_group(g).column(col).total_uncompressed_size for g in range(meta.num_row_groups))


def describe_sources(sources: Sequence[Path], stop: threading.Event | None = None) -> list[dict[str, Any]]:
    """``[{path, bytes, sha256}]`` for meta.json (``stop`` set: give up early, e.g. beside a failed run)."""
    out = []
    for path in sources:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            while (stop is None or not stop.is_set()) and (block := f.read(CHUNK_BYTES)):
                h.update(block)
        out.append({"path": str(path), "bytes": path.stat().st_size, "sha256": h.hexdigest()})
    return out


def jsonl_text(line: bytes) -> str:
    """The ``text`` field of one JSONL record; a bad record is a ``GptlabError`` saying what is wrong."""
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError:
        raise GptlabError("is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise GptlabError(f"is not valid JSON ({exc.msg})") from None
    if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise GptlabError(
            'has no string field "text"; JSONL input needs one object per line like {"text": "..."}'
        )
    return record["text"]


def parquet_file(path: Path) -> Any:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise GptlabError(
            f"{path}: reading parquet needs pyarrow; pip install pyarrow (or gptlab[parquet])"
        ) from None
    try:
        pf = pq.ParquetFile(path)
    except Exception as exc:  # pyarrow raises its own ArrowInvalid / OSError types
        raise GptlabError(f"{path}: not a readable parquet file ({exc})") from None
    names = pf.schema_arrow.names
    if "text" not in names:
        raise GptlabError(
            f"{path}: parquet file has no 'text' column (columns: {', '.join(names) or 'none'}); "
            f"rename the column holding the documents to 'text'"
        )
    return pf
