"""A corpus cut into pieces that any process can read by itself, from a file name and an offset.

Text and JSONL files are cut in blocks of ``C = CHUNK_BYTES`` bytes. Piece ``k`` of a file holds
the bytes ``[b_{k-1}, b_k)``, where ``b_{-1} = 0``, the last piece ends at the file's end, and

    b_k = 1 + (offset of the last newline in block k = [k·C, (k+1)·C))

When block ``k`` holds no newline, a text file is cut at the last character boundary ``≤ (k+1)·C``
(so a piece stays under ``2·C`` bytes whatever the line lengths), while a JSONL file is not cut
there (``b_k = b_{k-1}``: piece ``k`` is empty and its bytes go to the next piece, since a record
is a whole line). ``b_k`` depends only on the bytes of block ``k`` (and, for a JSONL line longer
than a block, the blocks before it), so a worker given ``(file, k)`` finds its own piece, and the
pieces are the same for any number of workers. A parquet file is cut into its row groups.

A piece reads back as ``(starts_document, text, utf8_bytes)`` triples: one per piece of a text
file (the first piece of a file starts its document), one per JSONL record or parquet row.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from gptlab.data import sources
from gptlab.errors import GptlabError

WINDOW = 1 << 16  # bytes read at a time while looking backwards for a newline


class Piece(NamedTuple):
    """Block ``index`` of a text or JSONL file, or row group ``index`` of a parquet file."""

    path: str
    kind: str  # "text" | "jsonl" | "parquet"
    index: int  # type: ignore[assignment]  # the field shadows tuple.index, which nothing calls
    chunk_bytes: int
    size: int  # bytes of the file (text, JSONL) or of the row group's text column (parquet, for progress)


def plan_pieces(paths: Sequence[Path], chunk_bytes: int | None = None) -> Iterator[Piece]:
    """Every piece of every source, in order (a parquet file's 'text' column is checked here)."""
    chunk = chunk_bytes or sources.CHUNK_BYTES
    for path in paths:
        kind = KINDS.get(path.suffix.lower(), "text")
        if kind == "parquet":
            meta = sources.parquet_file(path).metadata
            col = meta.schema.names.index("text")
            for g in range(meta.num_row_groups):
                yield Piece(str(path), kind, g, chunk, meta.row_group(g).column(col).total_uncompressed_size)
            continue
        size = path.stat().st_size
        for k in range(-(-size // chunk)):
            yield Piece(str(path), kind, k, chunk, size)


def piece_bytes(piece: Piece) -> int:
    """Bytes of the source a piece stands for, for progress (the block, or the row group's column)."""
    if piece.kind == "parquet":
        return piece.size
    start = piece.index * piece.chunk_bytes
    return min(start + piece.chunk_bytes, piece.size) - start


def read_piece(piece: Piece) -> list[tuple[bool, str, int]]:
    """``(starts_document, text, utf8_bytes)`` of one piece, in order."""
    return READERS[piece.kind](piece)


def iter_chunks(paths: Sequence[Path], chunk_bytes: int | None = None) -> Iterator[tuple[bool, str]]:
    """``(starts_document, text)`` pieces of every source, in order (``CHUNK_BYTES`` at a time by default)."""
    for piece in plan_pieces(paths, chunk_bytes):
        for start, text, _ in read_piece(piece):
            yield start, text


def count_documents(paths: Sequence[Path]) -> int:
    return sum(1 for start, _ in iter_chunks(paths) if start)


# ------------------------------------------------------------------ finding a piece's bytes
def _cut(f: object, piece: Piece, k: int) -> int:
    """``b_k`` (see the module docstring): where piece ``k`` of the file ends."""
    chunk, size = piece.chunk_bytes, piece.size
    while k >= 0:
        end = (k + 1) * chunk
        if end >= size:
            return size
        pos, lo = end, k * chunk
        while pos > lo:  # the last newline of block k, looking back a window at a time
            start = max(lo, pos - WINDOW)
            f.seek(start)  # type: ignore[attr-defined]
            j = f.read(pos - start).rfind(b"\n")  # type: ignore[attr-defined]
            if j >= 0:
                return start + j + 1
            pos = start
        if piece.kind == "text":  # no newline: the last character boundary ≤ end (skip continuation bytes)
            f.seek(end - 3)  # type: ignore[attr-defined]
            tail = f.read(4)  # type: ignore[attr-defined]
            i = 3
            while i > 0 and 0x80 <= tail[i] < 0xC0:
                i -= 1
            return end - 3 + i
        k -= 1  # JSONL: a record is a whole line, so the cut is the previous block's
    return 0


def _piece_range(piece: Piece) -> tuple[int, bytes]:
    """``(b_{k-1}, bytes [b_{k-1}, b_k))`` of a text or JSONL piece (empty bytes: nothing to read)."""
    with open(piece.path, "rb") as f:
        end = _cut(f, piece, piece.index)
        start = _cut(f, piece, piece.index - 1)
        if end <= start:
            return start, b""
        f.seek(start)
        return start, f.read(end - start)


# ------------------------------------------------------------------ reading a piece
def _text_piece(piece: Piece) -> list[tuple[bool, str, int]]:
    """The UTF-8 text of a piece; a NUL byte or invalid UTF-8 is a ``GptlabError`` with the file offset."""
    offset, raw = _piece_range(piece)
    nul = raw.find(b"\0")
    if nul >= 0:
        raise GptlabError(
            f"{piece.path}: looks like a binary file (NUL byte at offset {offset + nul}); give UTF-8 text files"
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GptlabError(
            f"{piece.path}: not UTF-8 text (invalid byte at offset {offset + exc.start}); "
            f"convert it to UTF-8 first (e.g. iconv -f latin1 -t utf-8)"
        ) from None
    return [(piece.index == 0, text, len(raw))] if raw else []


def _jsonl_piece(piece: Piece) -> list[tuple[bool, str, int]]:
    """The ``text`` of each JSONL record (line) of a piece; a bad line names its line number."""
    offset, raw = _piece_range(piece)
    out = []
    for i, line in enumerate(raw.split(b"\n")):
        if line.strip():
            try:
                text = sources.jsonl_text(line)
            except GptlabError as exc:
                lineno = _lines_before(piece.path, offset) + i + 1
                raise GptlabError(f"{piece.path}: line {lineno} {exc}") from None
            out.append((True, text, len(text.encode("utf-8", "surrogatepass"))))
    return out


def _lines_before(path: str, offset: int) -> int:
    """Newlines in the file's first ``offset`` bytes (only on the way to an error message)."""
    count = 0
    with open(path, "rb") as f:
        while offset > 0:
            block = f.read(min(offset, 1 << 20))
            count += block.count(b"\n")
            offset -= len(block)
    return count


def _parquet_piece(piece: Piece) -> list[tuple[bool, str, int]]:
    """Each row's ``text`` in one row group (null rows skipped)."""
    table = sources.parquet_file(Path(piece.path)).read_row_group(piece.index, columns=["text"])
    out = []
    for doc in table.column(0).to_pylist():
        if doc is None:
            continue
        if not isinstance(doc, str):
            raise GptlabError(f"{piece.path}: the 'text' column holds {type(doc).__name__}, not strings")
        out.append((True, doc, len(doc.encode("utf-8", "surrogatepass"))))
    return out


KINDS = {".jsonl": "jsonl", ".parquet": "parquet"}  # any other suffix is read as plain text
READERS = {"text": _text_piece, "jsonl": _jsonl_piece, "parquet": _parquet_piece}
