"""A prepared dataset directory, read back: token memmaps per split, the tokenizer and the meta.

Format 2 lists each split's shard files in ``meta.json`` (``shards``: file, tokens, sha256);
format 1 (one ``train.bin`` and ``val.bin``) still loads.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gptlab.data.shards import open_split
from gptlab.data.sources import PathLike
from gptlab.errors import GptlabError

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

DATASET_FORMAT = 2
META_FILE = "meta.json"
TOKENIZER_FILE = "tokenizer.json"
SPLITS = ("train", "val")
EOT = "<|endoftext|>"


def check_val_fraction(val_fraction: float) -> None:
    """The validation share of a split: strictly between 0 and 1, else one ``GptlabError`` line."""
    if not 0.0 < val_fraction < 1.0:
        raise GptlabError(f"--val-fraction must be between 0 and 1 (exclusive), got {val_fraction}")


def new_dataset_dir(out_dir: PathLike, val_fraction: float) -> Path:
    """``out_dir`` for a new dataset (absent or empty) after checking ``val_fraction``; else one error line."""
    check_val_fraction(val_fraction)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise GptlabError(f"{out}: already exists and is not empty; choose another --out or delete it first")
    return out


@contextmanager
def staged_directory(out: Path) -> Iterator[Path]:
    """A fresh folder beside ``out`` to build a dataset in, renamed onto ``out`` (absent or empty) when the
    block ends; removed if it fails, so ``out`` is complete or absent."""
    stage = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        yield stage
        if out.exists():
            out.rmdir()
        os.replace(stage, out)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


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
        self._tokenizer: Tokenizer | None = None

    def split(self, name: str) -> np.ndarray:
        if name not in SPLITS:
            raise GptlabError(f"unknown split {name!r}; choose one of {', '.join(SPLITS)}")
        if name not in self._splits and "shards" in self.meta:
            self._splits[name] = open_split(self.dir, self.meta["shards"][name], self.dtype)
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

    def arrays(self, name: str, block_size: int | None = None) -> dict[str, np.ndarray]:
        """The loss mask and example positions stored beside a split's tokens (instruction data; else {}).

        Instruction data is stored in rows of ``block_size + 1`` tokens: a training context
        of another length is refused.
        """
        rows = self.meta.get("row_tokens")
        if rows and block_size is not None and block_size + 1 != rows:
            raise GptlabError(
                f"{self.dir} holds examples in rows of {rows} tokens (prepared with --block-size {rows - 1}); "
                f"train with model.block_size={rows - 1} or prepare it again"
            )
        out: dict[str, np.ndarray] = {}
        for key, dtype in (("mask", "uint8"), ("pos", self.meta.get("pos_dtype"))):
            path = self.dir / f"{name}.{key}.bin"
            if dtype and path.is_file():
                out[key] = np.memmap(path, dtype=np.dtype(dtype), mode="r")
                if len(out[key]) != len(self.split(name)):
                    raise GptlabError(f"{path}: not as long as {name}.bin; prepare the dataset again")
        return out

    @property
    def tokenizer(self) -> Tokenizer:
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
