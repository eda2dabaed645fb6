"""A model file's conversion, made once and kept: ``entry_for``, ``has_entry``, ``read_entry``, ``keep``.

Converting a GGUF file's 4-bit blocks into the int4 kernel's layout and its token table into int8
rows costs more at every start than reading a checkpoint of the result (SmolLM2: ~0.5 s of a 1 s
start after ``import torch``). ``gptlab.load(file, store=DIR)`` keeps the converted model as a
checkpoint in ``DIR`` the first time, and reads that checkpoint afterwards. A float32 checkpoint run
in bf16 is kept the same way, as a bf16 checkpoint: half the bytes to read and to check, and no
cast (``gptlab.sources``).

An entry is named by the sha256 of the source's identity (a file's resolved path, inode, size and
modification and change times; a folder's, each of its files': a rewritten, replaced or touched file
gets a new entry), the conversion asked for, ``FORMAT`` and gptlab's version. Its files are checked against their sha256
when it is read, as every checkpoint is, and an entry that fails the check is converted again. An
entry is written to a temporary folder and renamed into place, so a reader never sees half of one;
a store that cannot be written costs a warning, never the load.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from gptlab.errors import GptlabError

if TYPE_CHECKING:
    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer

#: the layout of an entry (a change makes every older one foreign; 2: a 4-bit token table kept int4)
FORMAT = 2


def entry_for(source: Path, conversion: str, store: str | os.PathLike[str]) -> Path:
    """The folder in ``store`` that holds (or will hold) ``source`` converted as ``conversion``. A GGUF file
    kept as it ships (``keep``) is kept per way of holding its Q8_0 matrices (``gptlab.hardware.int8_blocks``:
    int8 per channel, or two int4 planes), so each CPU kind reads the layout it multiplies faster."""
    from gptlab import __version__
    from gptlab.hardware import int8_blocks

    files = sorted(p for p in source.iterdir() if p.is_file()) if source.is_dir() else [source]
    identity = []
    for file in files:
        st = file.stat()
        identity += [str(file.resolve()), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns]
    held = [int8_blocks("cpu")] if conversion == "keep" else []
    key = json.dumps([*identity, conversion, *held, FORMAT, __version__])
    return Path(store) / hashlib.sha256(key.encode()).hexdigest()[:32]


def has_entry(source: Path, conversion: str, store: str | os.PathLike[str]) -> bool:
    """Whether ``store`` holds an entry for ``source`` converted as ``conversion`` (unchecked: ``read_entry``
    checks it)."""
    return _present(entry_for(source, conversion, store))


def _present(entry: Path) -> bool:
    """Whether ``entry`` holds a checkpoint (``keep`` renames it into place whole)."""
    return (entry / "config.json").is_file()


def read_entry(entry: Path, quantize: str | None = None) -> tuple[GPT, Tokenizer | None] | None:
    """The kept model and tokenizer (``quantize``: as ``gptlab.checkpoint.load`` reads a float entry for
    inference), or None where there is no entry yet (or it failed its check: then it is removed, with
    a warning, and the caller converts again)."""
    from gptlab.checkpoint.model import load

    if not _present(entry):
        return None
    try:
        return load(entry, quantize=quantize)
    except GptlabError as exc:
        warnings.warn(f"a kept conversion failed its check and is made again ({exc})", stacklevel=3)
        shutil.rmtree(entry, ignore_errors=True)
        return None


def keep(model: GPT, tokenizer: Tokenizer | None, entry: Path) -> bool:
    """Write ``model`` and ``tokenizer`` as the checkpoint ``entry`` (atomically); False, with a warning,
    where the store cannot be written."""
    from gptlab.checkpoint.model import save

    partial = entry.with_name(f".{entry.name}.{os.getpid()}.partial")
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)
        save(model, tokenizer, partial)
        try:
            partial.rename(entry)
        except OSError:  # another process kept the same conversion first: theirs stays
            shutil.rmtree(partial, ignore_errors=True)
            if not entry.is_dir():
                raise
        return True
    except (OSError, GptlabError) as exc:
        shutil.rmtree(partial, ignore_errors=True)
        warnings.warn(f"{entry.parent}: the converted weights could not be kept ({exc})", stacklevel=3)
        return False


__all__ = ["FORMAT", "entry_for", "has_entry", "keep", "read_entry"]
