"""Reading tokenizers, corpora and id lists from files, with errors that name the file.

>>> import tempfile, os
>>> from gptlab.tokenizers import CharTokenizer
>>> with tempfile.TemporaryDirectory() as folder:
...     path = os.path.join(folder, "tok.json")
...     CharTokenizer.from_text("abc").save(path)
...     load(path).encode("cab")
[2, 0, 1]
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path

from gptlab.errors import GptlabError
from gptlab.tokenizers.base import Tokenizer, from_dict
from gptlab.tokenizers.gpt2 import GPT2Tokenizer

PathLike = str | os.PathLike[str]


def read_text_file(path: PathLike) -> str:
    """A whole file as UTF-8 text; a missing or non-UTF-8 file is a ``GptlabError`` naming it."""
    name = os.fspath(path)
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise GptlabError(f"file {name!r} does not exist") from None
    except IsADirectoryError:
        raise GptlabError(f"{name!r} is a directory, not a text file") from None
    except OSError as exc:
        raise GptlabError(f"cannot read {name!r}: {exc.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GptlabError(
            f"{name!r} is not UTF-8 text: byte 0x{data[exc.start]:02x} at offset {exc.start} is invalid; "
            "convert it to UTF-8 first (e.g. iconv -f latin1 -t utf-8)"
        ) from None


def read_corpus(paths: Sequence[PathLike]) -> Iterator[str]:
    """Yield each file's text, one document per file (checked as it is read)."""
    for path in paths:
        yield read_text_file(path)


def load(path: PathLike) -> Tokenizer:
    """Load a tokenizer saved with ``save``, a GPT-2 folder, or a ``.tiktoken`` file.

    A missing or corrupt file is a ``GptlabError`` that names it.
    """
    name = os.fspath(path)
    p = Path(path)
    if p.is_dir():
        return GPT2Tokenizer.from_dir(p)
    if p.suffix == ".tiktoken":
        return GPT2Tokenizer.from_tiktoken(p)
    if not p.exists():
        raise GptlabError(f"tokenizer file {name!r} does not exist")
    try:
        data = json.loads(p.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise GptlabError(f"tokenizer file {name!r} is corrupt: not UTF-8 JSON ({exc})") from None
    except OSError as exc:
        raise GptlabError(f"cannot read tokenizer file {name!r}: {exc.strerror}") from None
    try:
        return from_dict(data)
    except GptlabError as exc:
        raise GptlabError(f"tokenizer file {name!r} is corrupt or unsupported: {exc}") from None


_SEPARATORS = re.compile(r"[\s,\[\]]+")


def parse_ids(text: str) -> list[int]:
    """Token ids written as ``"1 2 3"``, ``"1,2,3"`` or ``"[1, 2, 3]"`` -> ``[1, 2, 3]``.

    >>> parse_ids("[15496, 995]")
    [15496, 995]
    """
    ids = []
    for word in _SEPARATORS.split(text):
        if not word:
            continue
        try:
            ids.append(int(word))
        except ValueError:
            raise GptlabError(
                f"{word!r} is not a token id; give integers separated by spaces or commas"
            ) from None
    return ids
