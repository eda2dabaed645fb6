"""Datasets: corpora → token shards on disk, and shards → training batches.

``prepare(inputs, out_dir, tokenizer)`` writes a dataset directory::

    train.bin   token ids, a flat numpy memmap (uint16 when the vocabulary fits, else uint32)
    val.bin     the last ``val_fraction`` of the tokens, same format
    tokenizer.json
    meta.json   token and byte counts, dtype, tokenizer, source files (size, sha256)

Inputs are text files, directories (searched recursively for ``*.txt``, ``*.md`` …)
or JSONL files with a ``text`` field. Each file (each JSONL line) is a document;
documents are separated by ``<|endoftext|>`` when the tokenizer has it. Files are
read in chunks, so corpora larger than memory stream through. The directory is
built under a temporary name and renamed into place, so it is complete or absent.

Training batches (``WindowSampler``) are windows of ``T + 1`` tokens,
``x = w[:T]`` and ``y = w[1:]``: the targets of eq. 10 are the inputs shifted by one.
"""

from __future__ import annotations

import codecs
import hashlib
import json
import math
import os
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json

DATASET_FORMAT = 1
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"
SPLITS = ("train", "val")
TEXT_SUFFIXES = (".txt", ".md", ".rst", ".text", ".jsonl")
CHUNK_BYTES = 1 << 20
EOT = "<|endoftext|>"

PathLike = str | os.PathLike[str]


# ---------------------------------------------------------------- sources
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


def iter_chunks(sources: Sequence[Path], chunk_bytes: int = CHUNK_BYTES) -> Iterator[tuple[bool, str]]:
    """``(starts_document, text)`` pieces of every source, in order."""
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


# ---------------------------------------------------------------- tokenizer
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
    if Path(spec).exists():
        return tokenizers.load(spec)
    raise GptlabError(
        f"--tokenizer {spec!r}: choose char, bpe:N (e.g. bpe:4096), gpt2:DIR or a saved tokenizer file"
    )


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.uint32)


# ---------------------------------------------------------------- prepare
def prepare(
    inputs: Sequence[PathLike],
    out_dir: PathLike,
    tokenizer: str = "char",
    val_fraction: float = 0.1,
    block_size: int = 64,
    progress: bool = False,
) -> dict[str, Any]:
    """Tokenize ``inputs`` into ``out_dir`` (train.bin, val.bin, tokenizer.json, meta.json); return the meta.

    If ``out_dir`` already holds the same dataset (same sources, tokenizer and split) it is kept as is.
    """
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
        meta = _write_dataset(stage, sources, tok, dtype, val_fraction, block_size, progress)
        meta.update(
            wanted, sources=described, format=DATASET_FORMAT, tokenizer_kind=getattr(tok, "kind", None)
        )
        tok.save(stage / TOKENIZER_FILE)
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
) -> dict[str, Any]:
    from tqdm import tqdm

    total_bytes = sum(p.stat().st_size for p in sources)
    eot = tok.eot_id
    eot_bytes = len(EOT.encode()) if eot is not None else 0
    n_tokens = n_docs = text_bytes = 0
    all_path = stage / "train.bin"
    bar = tqdm(
        total=total_bytes,
        unit="B",
        unit_scale=True,
        desc="tokenizing",
        disable=not progress,
        leave=False,
        delay=1.0,
    )
    with open(all_path, "wb") as f:
        for start, text in iter_chunks(sources):
            ids = tok.encode(text)
            if start:
                if n_docs and eot is not None:
                    ids = [eot, *ids]
                    text_bytes += eot_bytes
                n_docs += 1
            raw = len(text.encode("utf-8"))
            text_bytes += raw
            np.asarray(ids, dtype=dtype).tofile(f)
            n_tokens += len(ids)
            bar.update(raw)
    bar.close()
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
    all_tokens = np.memmap(all_path, dtype=dtype, mode="r")
    val = np.array(all_tokens[n_train:])
    del all_tokens
    val.tofile(stage / "val.bin")
    os.truncate(all_path, n_train * dtype.itemsize)
    val_bytes = sum(
        len(tok.decode_bytes(val[i : i + CHUNK_BYTES].tolist())) for i in range(0, n_val, CHUNK_BYTES)
    )
    return {
        "dtype": dtype.name,
        "vocab_size": tok.vocab_size,
        "eot_id": eot,
        "documents": n_docs,
        "train_tokens": n_train,
        "val_tokens": n_val,
        "train_bytes": max(text_bytes - val_bytes, 1),
        "val_bytes": val_bytes,
    }


# ---------------------------------------------------------------- reading
class TokenDataset:
    """A prepared dataset directory: ``train``/``val`` token memmaps, the tokenizer and the meta."""

    def __init__(self, directory: PathLike) -> None:
        self.dir = Path(directory)
        meta_path = self.dir / META_FILE
        if not meta_path.is_file():
            hint = (
                " (a run directory? give the dataset directory made by `gptlab prepare`)"
                if any(self.dir.glob("ckpt-*"))
                else " (make one with `gptlab prepare INPUT --out DIR`)"
            )
            raise GptlabError(f"{self.dir}: not a dataset directory, {META_FILE} is missing{hint}")
        try:
            self.meta: dict[str, Any] = json.loads(meta_path.read_text(encoding="utf-8"))
            self.dtype = np.dtype(self.meta["dtype"])
            self.vocab_size = int(self.meta["vocab_size"])
        except (ValueError, KeyError, TypeError) as exc:
            raise GptlabError(
                f"{meta_path}: corrupt dataset meta ({exc}); prepare the dataset again"
            ) from None
        self._splits: dict[str, np.ndarray] = {}
        self._tokenizer: Any = None

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise GptlabError(f"unknown split {name!r}; choose one of {', '.join(SPLITS)}")
        if name not in self._splits:
            path = self.dir / f"{name}.bin"
            expected = int(self.meta.get(f"{name}_tokens", -1))
            if not path.is_file() or path.stat().st_size != expected * self.dtype.itemsize:
                raise GptlabError(
                    f"{path}: missing or of the wrong size (meta.json says {expected} tokens); "
                    f"prepare the dataset again"
                )
            self._splits[name] = np.memmap(path, dtype=self.dtype, mode="r")
        return self._splits[name]

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:
            from gptlab import tokenizers

            self._tokenizer = tokenizers.load(self.dir / TOKENIZER_FILE)
        return self._tokenizer

    def bytes_per_token(self, name: str) -> float:
        """UTF-8 bytes of text per token in a split (for bits per byte)."""
        return float(self.meta[f"{name}_bytes"]) / max(int(self.meta[f"{name}_tokens"]), 1)

    @property
    def fingerprint(self) -> str:
        """Identifies the dataset's content (sources, tokenizer, split)."""
        key = json.dumps(
            [self.meta.get("sources"), self.meta.get("tokenizer"), self.meta.get("val_fraction")],
            sort_keys=True,
            default=str,
        )
        return hashlib.sha256(key.encode()).hexdigest()[:16]


# ---------------------------------------------------------------- batches
@dataclass
class WindowSampler:
    """Training windows, sampled without replacement, epoch by epoch.

    The split is cut into ``n`` non-overlapping windows of ``T + 1`` tokens starting
    at ``shift_e + k·T``; epoch ``e`` visits them in the order of a permutation and
    with a shift that both depend only on ``(seed, e)``. Global sample ``g`` is
    therefore a pure function of ``g``: the data position is just the step, so a
    resumed run reads exactly the batches it would have read.

    Row ``j`` of micro-batch ``m`` of step ``s`` on rank ``r`` is sample
    ``((s·A + m)·W + r)·B + j``: ranks read disjoint rows of each global batch, and
    one micro-batch of ``2B`` holds the same rows as two of ``B`` (or two ranks of ``B``).
    """

    tokens: np.ndarray
    block_size: int
    batch_size: int
    seed: int = 0
    grad_accum: int = 1
    world_size: int = 1
    rank: int = 0

    def __post_init__(self) -> None:
        N, T = len(self.tokens), self.block_size
        if N < T + 1:
            raise GptlabError(
                f"the split has {N} tokens, fewer than one block of block_size + 1 = {T + 1}; "
                f"use a smaller model.block_size or more data"
            )
        self.n = max(1, (N - T) // T)
        self.shift_range = min(T, N - (T + 1) - (self.n - 1) * T + 1)
        self._epochs: dict[int, tuple[int, np.ndarray]] = {}
        self._offsets = np.arange(T + 1, dtype=np.int64)

    def _epoch(self, e: int) -> tuple[int, np.ndarray]:
        if e not in self._epochs:
            rng = np.random.default_rng([self.seed, e])
            shift = int(rng.integers(self.shift_range))
            self._epochs = {k: v for k, v in self._epochs.items() if k >= e - 1}
            self._epochs[e] = (shift, rng.permutation(self.n))
        return self._epochs[e]

    def starts(self, samples: np.ndarray) -> np.ndarray:
        """Token offsets of global samples ``samples``."""
        epochs, ks = np.divmod(samples, self.n)
        out = np.empty(len(samples), dtype=np.int64)
        for e in np.unique(epochs):
            sel = epochs == e
            shift, perm = self._epoch(int(e))
            out[sel] = shift + perm[ks[sel]] * self.block_size
        return out

    def batch(self, step: int, micro: int = 0) -> tuple[Any, Any]:
        """``(x, y)``: int64 tensors of shape (B, T) for micro-batch ``micro`` of ``step``."""
        import torch

        B = self.batch_size
        first = ((step * self.grad_accum + micro) * self.world_size + self.rank) * B
        starts = self.starts(np.arange(first, first + B, dtype=np.int64))
        w = torch.from_numpy(self.tokens[starts[:, None] + self._offsets].astype(np.int64))  # (B, T + 1)
        return w[:, :-1], w[:, 1:]

    def epoch_of(self, step: int) -> float:
        return (step * self.grad_accum * self.world_size * self.batch_size) / self.n


def eval_batches(
    tokens: np.ndarray, block_size: int, batch_size: int, max_batches: int | None = None
) -> Iterator[tuple[Any, Any]]:
    """Fixed evaluation batches: non-overlapping windows from the start of the split.

    ``max_batches=None`` covers the whole split (its last partial window aside);
    otherwise ``max_batches·B`` windows evenly spread over the split.
    """
    import torch

    T = block_size
    n = (len(tokens) - 1) // T
    if n < 1:
        raise GptlabError(f"the split has {len(tokens)} tokens, fewer than one block of {T + 1}")
    ks = np.arange(n, dtype=np.int64)
    if max_batches is not None and max_batches * batch_size < n:
        ks = np.unique(np.linspace(0, n - 1, max_batches * batch_size).round().astype(np.int64))
    offsets = np.arange(T + 1, dtype=np.int64)
    for i in range(0, len(ks), batch_size):
        w = torch.from_numpy(tokens[ks[i : i + batch_size, None] * T + offsets].astype(np.int64))
        yield w[:, :-1], w[:, 1:]


def n_eval_batches(n_tokens: int, block_size: int, batch_size: int, max_batches: int | None) -> int:
    n = max((n_tokens - 1) // block_size, 0)
    total = math.ceil(n / batch_size)
    return total if max_batches is None else min(total, max_batches)
