"""Corpus sources: the files behind a dataset, read as UTF-8 text in chunks that stream.

Inputs are text files, directories (searched recursively for ``*.txt``, ``*.md`` …),
JSONL files with a ``text`` field, or parquet files with a ``text`` column (pyarrow).
Each file (each JSONL line, each parquet row) is a document. Files are read in chunks
(parquet in record batches), so corpora larger than memory stream through.
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

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text", ".jsonl", ".parquet")
PARQUET_BATCH_ROWS = 1024
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
    meta = _parquet_file(path).metadata
    col = meta.schema.names.index("text")
    return sum(meta.row_group(g).column(col).total_uncompressed_size for g in range(meta.num_row_groups))


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


def _parquet_file(path: Path) -> Any:
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


def _parquet_documents(path: Path) -> Iterator[str]:
    """Each row's ``text`` (a string column), one record batch at a time; null rows are skipped."""
    pf = _parquet_file(path)
    for batch in pf.iter_batches(columns=["text"], batch_size=PARQUET_BATCH_ROWS):
        for doc in batch.column(0).to_pylist():
            if doc is None:
                continue
            if not isinstance(doc, str):
                raise GptlabError(f"{path}: the 'text' column holds {type(doc).__name__}, not strings")
            yield doc


DOCUMENT_READERS = {".jsonl": _jsonl_documents, ".parquet": _parquet_documents}  # one document per record


def iter_chunks(sources: Sequence[Path], chunk_bytes: int | None = None) -> Iterator[tuple[bool, str]]:
    """``(starts_document, text)`` pieces of every source, in order (``CHUNK_BYTES`` at a time by default)."""
    chunk_bytes = chunk_bytes or CHUNK_BYTES
    for path in sources:
        reader = DOCUMENT_READERS.get(path.suffix.lower())
        if reader is not None:
            for doc in reader(path):
                yield True, doc
        else:
            first = True
            for piece in _text_chunks(path, chunk_bytes):
                yield first, piece
                first = False


def count_documents(sources: Sequence[Path]) -> int:
    return sum(1 for start, _ in iter_chunks(sources) if start)
