"""``gptlab prepare``: corpora → token shards on disk.

``prepare(inputs, out_dir, tokenizer)`` writes a dataset directory::

    train.bin   token ids, a flat numpy memmap (uint16 when the vocabulary fits, else uint32)
    val.bin     the last ``val_fraction`` of the tokens, same format
    tokenizer.json
    meta.json   token and byte counts, dtype, tokenizer, source files (size, sha256),
                and each split's shard files (tokens, sha256)

With ``shard_tokens = M`` the splits are numbered shards ``train-00000.bin``, … of at most
``M`` tokens (``gptlab.data.shards``). ``workers = N`` tokenizes with a pool of processes
that each read their own pieces of the input (``gptlab.data.pieces``: a file and an offset)
and return their ids in order (``gptlab.data.workers``): the files are byte-identical for any
``N``. The input streams through (1 MB pieces, a bounded queue), so memory stays flat.

This process only appends the ids to the shards, hashing each shard as it is written. The
val split is the last ``n_val = ⌊n·val_fraction⌋`` tokens: once the total ``n`` is known they
are copied into val shards and the train shards truncated (only the bytes since the last
kept hash state are hashed again), and ``val_bytes`` is the pieces after the cut plus the
decoded tail of the piece it falls in. The tokenizer file and the sources' checksums are
written beside the workers, in a thread.

Documents are separated by ``<|endoftext|>`` when the tokenizer has it. The directory is
built under a temporary name and renamed into place, so it is complete or absent.
"""

from __future__ import annotations

import bisect
import json
import threading
from array import array
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gptlab.data.dataset import (
    DATASET_FORMAT,
    EOT,
    META_FILE,
    TOKENIZER_FILE,
    check_val_fraction,
    staged_directory,
)
from gptlab.data.pieces import iter_chunks, plan_pieces
from gptlab.data.shards import COPY_TOKENS, ShardWriter, read_tokens
from gptlab.data.sources import PathLike, describe_sources, find_sources, source_bytes
from gptlab.data.workers import TokenizerPool
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

#: ``spec`` → the tokenizer of the model it names, or None when it names no model
#: (``gptlab.sources.model_tokenizer``: this package does not open models itself)
ModelTokenizer = Callable[[str], Any]


def build_tokenizer(
    spec: str, sources: Sequence[Path], model_tokenizer: ModelTokenizer | None = None
) -> Tokenizer:
    """``char`` | ``bpe:N`` | ``gpt2:DIR`` | a saved tokenizer FILE | a model (through ``model_tokenizer``)
    → a tokenizer."""
    from gptlab import tokenizers

    if spec == "char":
        chars: set[str] = set()
        n_docs = 0
        for start, text in iter_chunks(sources):
            chars.update(text)
            n_docs += start
        if not chars:
            raise GptlabError("the corpus is empty; give it some text")
        specials = {EOT: len(chars)} if n_docs > 1 else {}  # separate documents only when there are several
        return tokenizers.CharTokenizer(sorted(chars), special_tokens=specials)
    if spec.startswith("bpe:"):
        try:
            size = int(spec[4:])
        except ValueError:
            raise GptlabError(
                f"--tokenizer {spec!r}: the vocabulary size must be an integer, e.g. bpe:4096"
            ) from None
        return tokenizers.BPETokenizer.train((text for _, text in iter_chunks(sources)), size, progress=False)
    if spec.startswith("gpt2:"):
        return tokenizers.GPT2Tokenizer.from_dir(spec[5:])
    tok = saved_tokenizer(spec, model_tokenizer)
    if tok is not None:
        return tok
    raise GptlabError(
        f"--tokenizer {spec!r}: choose char, bpe:N (e.g. bpe:4096), gpt2:DIR, a saved tokenizer file "
        f"or a model (checkpoint, Hugging Face folder, GGUF file)"
    )


def saved_tokenizer(spec: str, model_tokenizer: ModelTokenizer | None = None) -> Tokenizer | None:
    """A saved tokenizer (a file, a GPT-2 folder: ``tokenizers.load``) or the tokenizer of the model
    ``spec`` names (through ``model_tokenizer``); None where ``spec`` names nothing there."""
    from gptlab import tokenizers

    path = Path(spec)
    if path.is_file() and path.suffix.lower() != ".gguf":  # a saved tokenizer: no model (nor torch) to load
        return tokenizers.load(spec)
    tok = model_tokenizer(spec) if model_tokenizer is not None else None
    if tok is not None:  # a checkpoint, Hugging Face folder or GGUF file: the model's own tokenizer
        return tok
    if model_tokenizer is None and (path.is_dir() or path.suffix.lower() == ".gguf"):
        raise GptlabError(
            f"--tokenizer {spec!r} names a model: give model_tokenizer=gptlab.sources.model_tokenizer "
            f"to read its tokenizer (gptlab prepare does)"
        )
    return tokenizers.load(spec) if path.exists() else None


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


def prepare(
    inputs: Sequence[PathLike],
    out_dir: PathLike,
    tokenizer: str = "char",
    val_fraction: float = 0.1,
    block_size: int = 64,
    progress: bool = False,
    workers: int = 1,
    shard_tokens: int = 0,
    model_tokenizer: ModelTokenizer | None = None,
) -> dict[str, Any]:
    """Tokenize ``inputs`` into ``out_dir`` (train/val shards, tokenizer.json, meta.json); return the meta.

    If ``out_dir`` already holds the same dataset (same sources, tokenizer, split and sharding) it is kept.
    """
    if workers < 1 or shard_tokens < 0:
        raise GptlabError(f"--workers must be ≥ 1 and --shard-tokens ≥ 0, got {workers} and {shard_tokens}")
    check_val_fraction(val_fraction)
    if block_size < 1:
        raise GptlabError(f"--block-size must be positive, got {block_size}")
    out = Path(out_dir)
    sources = find_sources(inputs)
    settings = {"tokenizer": tokenizer, "val_fraction": val_fraction, "shard_tokens": shard_tokens}
    described = None
    if out.exists():  # the sources' checksums are needed now; otherwise they are taken beside the workers
        described = describe_sources(sources)
        existing = _existing_dataset(out)
        if existing is not None and _same_dataset(existing, _wanted(settings, described)):
            return existing
        if existing is not None or not out.is_dir() or any(out.iterdir()):
            raise GptlabError(
                f"{out}: already holds {'a different dataset' if existing else 'other files'}; "
                f"choose another --out or delete it first"
            )
    tok = build_tokenizer(tokenizer, sources, model_tokenizer)
    dtype = token_dtype(tok.vocab_size)
    with staged_directory(out) as stage:
        tok_file = stage / TOKENIZER_FILE
        stop = threading.Event()
        # the workers start first (forked before this process runs a thread of its own); the tokenizer file
        # (unless spawned workers needed it first) and the sources' checksums are then done beside them
        with TokenizerPool(tok, dtype, workers, tok_file) as pool, ThreadPoolExecutor(1) as side:
            saved = side.submit(tok.save, tok_file) if not tok_file.exists() else None
            hashed = side.submit(describe_sources, sources, stop) if described is None else None
            try:
                meta = _write_dataset(
                    stage, sources, tok, dtype, val_fraction, block_size, progress, pool, shard_tokens
                )
            except BaseException:
                stop.set()
                raise
            if saved is not None:
                saved.result()
            described = described if hashed is None else hashed.result()
        assert described is not None  # described first, or hashed beside the workers
        meta.update(
            _wanted(settings, described),
            sources=described,
            format=DATASET_FORMAT,
            tokenizer_kind=getattr(tok, "kind", None),
        )
        atomic_write_json(stage / META_FILE, meta)
    return meta


def _wanted(settings: dict[str, Any], described: list[dict[str, Any]]) -> dict[str, Any]:
    """What makes a dataset the same: the settings and each source's size and checksum."""
    sources = [{k: s[k] for k in ("bytes", "sha256")} for s in described]
    return {
        "tokenizer": settings["tokenizer"],
        "val_fraction": settings["val_fraction"],
        "sources": sources,
        "shard_tokens": settings["shard_tokens"],
    }


def _existing_dataset(out: Path) -> dict[str, Any] | None:
    meta_path = out / META_FILE
    if not meta_path.is_file():
        return None
    try:
        return json.loads(meta_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _same_dataset(meta: dict[str, Any], wanted: dict[str, Any]) -> bool:
    have = {
        "tokenizer": meta.get("tokenizer"),
        "val_fraction": meta.get("val_fraction"),
        "sources": [{k: s.get(k) for k in ("bytes", "sha256")} for s in meta.get("sources", [])],
        "shard_tokens": meta.get("shard_tokens", 0),
    }
    return have == wanted


def _write_dataset(
    stage: Path,
    sources: Sequence[Path],
    tok: Tokenizer,
    dtype: np.dtype,
    val_fraction: float,
    block_size: int,
    progress: bool,
    pool: TokenizerPool,
    shard_tokens: int,
) -> dict[str, Any]:
    """Stream every piece through the tokenizer pool into shards, then cut the last tokens off as val."""
    from tqdm import tqdm

    eot = tok.eot_id
    eot_bytes = len(EOT.encode()) if eot is not None else 0
    n_docs = text_bytes = n_tokens = 0
    ends, sizes = array("q"), array("q")  # per piece: cumulative tokens, text bytes (for val_bytes)
    writer = ShardWriter(stage, "train", dtype, shard_tokens)
    bar = tqdm(
        total=sum(source_bytes(p) for p in sources),
        unit="B",
        unit_scale=True,
        desc=f"tokenizing ({pool.workers} worker{'s' if pool.workers > 1 else ''})",
        disable=not progress,
        leave=False,
        delay=1.0,
    )
    for piece in pool.encode(plan_pieces(sources)):
        ids, size = piece.ids, piece.text_bytes
        if piece.documents and not n_docs and eot is not None:  # no separator before the first document
            ids, size = ids[1:], size - eot_bytes
        n_docs += piece.documents
        writer.write(ids)
        n_tokens += len(ids)
        text_bytes += size
        ends.append(n_tokens)
        sizes.append(size)
        bar.update(piece.source_bytes)
    bar.close()
    entries = writer.close()
    if n_tokens == 0:
        raise GptlabError("the corpus is empty; give it some text")
    n_val = int(n_tokens * val_fraction)
    n_train = n_tokens - n_val
    need = block_size + 1
    if n_train < need or n_val < need:
        raise GptlabError(
            f"the corpus has {n_tokens} tokens: too small for one training block of {block_size} "
            f"tokens in both splits (train {n_train}, val {n_val}, each needs ≥ {need}); "
            f"give more text, a larger --val-fraction or a smaller --block-size"
        )
    val_writer = ShardWriter(stage, "val", dtype, writer.shard_tokens)
    for i in range(n_train, n_tokens, COPY_TOKENS):  # the last n_val tokens, a chunk at a time
        val_writer.write(read_tokens(stage, entries, dtype, i, min(i + COPY_TOKENS, n_tokens)))
    # val bytes: the pieces wholly after the cut, plus the decoded tail of the piece it falls in
    p = bisect.bisect_right(ends, n_train)
    tail = read_tokens(stage, entries, dtype, n_train, ends[p])
    val_bytes = len(tok.decode_bytes(tail.tolist())) + sum(sizes[p + 1 :])
    shards = {"train": writer.truncate(n_train), "val": val_writer.close()}
    return {
        "dtype": dtype.name,
        "vocab_size": tok.vocab_size,
        "eot_id": eot,
        "documents": n_docs,
        "train_tokens": n_train,
        "val_tokens": n_val,
        "train_bytes": max(text_bytes - val_bytes, 1),
        "val_bytes": val_bytes,
        "shards": shards,
    }
