"""Built-in corpora: an offline default and an optional download.

* ``default_corpus()``: Python's own documentation topics (``pydoc_data.topics``,
  about 465 KB of English that ships with CPython), so ``gptlab demo`` needs no network.
* ``download(name, out)``: fetch a public corpus (Tiny Shakespeare) when there is a
  network; without one, a ``GptlabError`` says so and how to get the file by hand.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from pathlib import Path
from typing import TypedDict

from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_bytes, atomic_write_text


class Corpus(TypedDict):
    url: str
    file: str
    bytes: int  # the file's size: a complete download has exactly this many


CORPORA: dict[str, Corpus] = {
    "shakespeare": {
        "url": "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt",
        "file": "tinyshakespeare.txt",
        "bytes": 1115394,
    },
}


def default_corpus() -> str:
    """The offline default corpus: every ``pydoc_data.topics`` entry, in key order, as one text."""
    try:
        from pydoc_data.topics import topics
    except ImportError:  # a Python built without its documentation data
        raise GptlabError(
            "this Python has no pydoc_data module (the offline default corpus); "
            "give a text file with --data FILE"
        ) from None
    return "\n\n".join(topics[key].strip() for key in sorted(topics)) + "\n"


def write_default_corpus(path: str | os.PathLike[str]) -> Path:
    """Write ``default_corpus()`` to ``path`` (atomically) and return it."""
    return atomic_write_text(path, default_corpus())


def download(name: str, out_dir: str | os.PathLike[str], timeout: float = 30.0) -> Path:
    """Download the corpus ``name`` into ``out_dir``; return the file's path."""
    if name not in CORPORA:
        raise GptlabError(f"unknown corpus {name!r}; choose one of {', '.join(CORPORA)}")
    spec = CORPORA[name]
    path = Path(out_dir) / spec["file"]
    if path.is_file() and path.stat().st_size == spec["bytes"]:
        return path
    try:
        with urllib.request.urlopen(spec["url"], timeout=timeout) as response:  # noqa: S310 (fixed https URL)
            data = response.read()
    except (urllib.error.URLError, OSError, TimeoutError) as exc:
        reason = getattr(exc, "reason", exc)
        raise GptlabError(
            f"cannot download {name} from {spec['url']} ({reason}); this machine seems to be "
            f"offline: fetch the file elsewhere and pass it with --data, or use the built-in "
            f"default corpus (gptlab demo without --data)"
        ) from None
    if len(data) != spec["bytes"]:
        raise GptlabError(f"downloaded {name} has {len(data)} bytes, expected {spec['bytes']}; try again")
    atomic_write_bytes(path, data)
    return path


def sha256_file(path: str | os.PathLike[str], chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()
