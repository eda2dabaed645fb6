"""``gptlab prepare``: corpora → token shards on disk.

``prepare(inputs, out_dir, tokenizer)`` writes a dataset directory::

    train.bin   token ids, a flat numpy memmap (uint16 when the vocabulary fits, else uint32)
    val.bin     the last ``val_fraction`` of the tokens, same format
    tokenizer.json
    meta.json   token and byte counts, dtype, tokenizer, source files (size, sha256),
                and each split's shard files (tokens, sha256)

With ``shard_tokens = M`` the splits are numbered shards ``train-00000.bin``, … of at most
``M`` tokens (``gptlab.data.shards``). ``workers = N`` tokenizes with a pool of processes
that return pieces in order (``gptlab.data.workers``): the files are byte-identical for any
``N``. The input streams through (1 MB pieces, a bounded queue), so memory stays flat.

Documents are separated by ``<|endoftext|>`` when the tokenizer has it. The directory is
built under a temporary name and renamed into place, so it is complete or absent.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from gptlab.data.corpus import sha256_file
from gptlab.data.dataset import DATASET_FORMAT, EOT, META_FILE, TOKENIZER_FILE
from gptlab.data.shards import COPY_TOKENS, ShardWriter, open_split
from gptlab.data.sources import (
    CHUNK_BYTES,
    PathLike,
    describe_sources,
    find_sources,
    iter_chunks,
    source_bytes,
)
from gptlab.data.workers import encode_in_order
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json


def build_tokenizer(spec: str, sources: Sequence[Path]) -> Any:
    """``char`` | ``bpe:N`` | ``gpt2:DIR`` | a saved tokenizer FILE → a tokenizer."""
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
    from gptlab.train.init import is_model_source, source_tokenizer

    if is_model_source(spec):  # a checkpoint, Hugging Face folder or GGUF file: the model's own tokenizer
        return source_tokenizer(spec)
    if Path(spec).exists():
        return tokenizers.load(spec)
    raise GptlabError(
        f"--tokenizer {spec!r}: choose char, bpe:N (e.g. bpe:4096), gpt2:DIR, a saved tokenizer file "
        f"or a model (checkpoint, Hugging Face folder, GGUF file)"
    )


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
) -> dict[str, Any]:
    """Tokenize ``inputs`` into ``out_dir`` (train/val shards, tokenizer.json, meta.json); return the meta.

    If ``out_dir`` already holds the same dataset (same sources, tokenizer, split and sharding) it is kept.
    """
    if workers < 1 or shard_tokens < 0:
        raise GptlabError(f"--workers must be ≥ 1 and --shard-tokens ≥ 0, got {workers} and {shard_tokens}")
    if not 0.0 < val_fraction < 1.0:
        raise GptlabError(f"--val-fraction must be between 0 and 1 (exclusive), got {val_fraction}")
    if block_size < 1:
        raise GptlabError(f"--block-size must be positive, got {block_size}")
    out = Path(out_dir)
    sources = find_sources(inputs)
    described = describe_sources(sources)
    wanted = {
        "tokenizer": tokenizer,
        "val_fraction": val_fraction,
        "sources": [{k: s[k] for k in ("bytes", "sha256")} for s in described],
        "shard_tokens": shard_tokens,
    }
    if out.exists():
        existing = _existing_dataset(out)
        if existing is not None and _same_dataset(existing, wanted):
            return existing
        if existing is not None or not out.is_dir() or any(out.iterdir()):
            raise GptlabError(
                f"{out}: already holds {'a different dataset' if existing else 'other files'}; "
                f"choose another --out or delete it first"
            )
    tok = build_tokenizer(tokenizer, sources)
    dtype = token_dtype(tok.vocab_size)
    stage = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        tok.save(stage / TOKENIZER_FILE)  # first: the workers load it
        meta = _write_dataset(
            stage, sources, tok, dtype, val_fraction, block_size, progress, workers, shard_tokens
        )
        meta.update(
            wanted, sources=described, format=DATASET_FORMAT, tokenizer_kind=getattr(tok, "kind", None)
        )
        atomic_write_json(stage / META_FILE, meta)
        if out.exists():
            out.rmdir()  # checked empty above
        os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return meta


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
    tok: Any,
    dtype: np.dtype,
    val_fraction: float,
    block_size: int,
    progress: bool,
    workers: int = 1,
    shard_tokens: int = 0,
) -> dict[str, Any]:
    """Stream every piece through the tokenizer (pool) into shards, then cut the last tokens off as val."""
    from tqdm import tqdm

    eot = tok.eot_id
    eot_bytes = len(EOT.encode()) if eot is not None else 0
    n_docs = text_bytes = 0
    writer = ShardWriter(stage, "train", dtype, shard_tokens)  # the whole corpus; val is cut off its end
    bar = tqdm(
        total=sum(source_bytes(p) for p in sources),
        unit="B",
        unit_scale=True,
        desc=f"tokenizing ({workers} worker{'s' if workers > 1 else ''})",
        disable=not progress,
        leave=False,
        delay=1.0,
    )
    pieces = (((start, len(text.encode("utf-8"))), text) for start, text in iter_chunks(sources))
    for (start, raw), ids in encode_in_order(pieces, tok, stage / TOKENIZER_FILE, dtype, workers):
        if start:
            if n_docs and eot is not None:
                writer.write(np.asarray([eot], dtype=dtype))
                text_bytes += eot_bytes
            n_docs += 1
        writer.write(ids)
        text_bytes += raw
        bar.update(raw)
    bar.close()
    entries = writer.close()
    n_tokens = sum(e["tokens"] for e in entries)
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
    shards = _cut_val(stage, entries, n_train, dtype, shard_tokens)
    val = open_split(stage, shards["val"], dtype)
    val_bytes = sum(
        len(tok.decode_bytes(val[i : min(i + CHUNK_BYTES, n_val)].tolist()))
        for i in range(0, n_val, CHUNK_BYTES)
    )
    for split_entries in shards.values():
        for entry in split_entries:
            entry["sha256"] = sha256_file(stage / entry["file"])
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


def _cut_val(
    stage: Path, entries: list[dict[str, Any]], n_train: int, dtype: np.dtype, shard_tokens: int
) -> dict[str, list[dict[str, Any]]]:
    """Copy tokens ``[n_train, N)`` into val shards (a chunk at a time), then truncate the train shards."""
    tokens = open_split(stage, entries, dtype)
    writer = ShardWriter(stage, "val", dtype, shard_tokens)
    for i in range(n_train, len(tokens), COPY_TOKENS):
        writer.write(tokens[i : min(i + COPY_TOKENS, len(tokens))])
    val = writer.close()
    del tokens
    train, start = [], 0
    for entry in entries:
        path, keep = stage / entry["file"], max(0, min(entry["tokens"], n_train - start))
        start += entry["tokens"]
        if keep == 0:
            path.unlink()
            continue
        os.truncate(path, keep * dtype.itemsize)
        train.append({"file": entry["file"], "tokens": keep})
    return {"train": train, "val": val}
