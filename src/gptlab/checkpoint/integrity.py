"""Checksums of a checkpoint's files: ``checksums.json`` records the SHA-256 of every other file in the
checkpoint directory (sub-directories included: an FSDP checkpoint's ``sharded/`` shards), and loading
verifies them before any byte is used.

safetensors and JSON carry no checksum of their own: a flipped bit inside a tensor loads without
complaint. With ``checksums.json``, a file whose digest differs is refused by name::

    checksums.json   {"algorithm": "sha256", "files": {"model.safetensors": "<hex>", "sharded/…": "<hex>"}}

``checksums.json`` is written last, atomically, once every other file is complete. A checkpoint
without it (written before gptlab recorded checksums, or assembled by hand) loads unverified; one
that has it must match it exactly (a listed file that is missing is refused too). Verification reads
each file once (SHA-256 at disk speed).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable
from pathlib import Path

from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json

CHECKSUMS_FILE = "checksums.json"
_CHUNK = 1 << 22


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes, as hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _files(directory: Path) -> list[str]:
    """Every regular file under ``directory`` (relative, POSIX-style, sorted), except the checksums and
    temporary files of an unfinished atomic write."""
    out = []
    for path in directory.rglob("*"):
        rel = path.relative_to(directory).as_posix()
        if path.is_file() and rel != CHECKSUMS_FILE and not path.name.startswith("."):
            out.append(rel)
    return sorted(out)


def write_checksums(directory: str | os.PathLike[str], names: Iterable[str] | None = None) -> dict[str, str]:
    """Record the SHA-256 of the files ``names`` (those that exist; default: every file in ``directory``)
    in ``checksums.json``, written last and atomically."""
    directory = Path(directory)
    listed = _files(directory) if names is None else sorted(n for n in names if (directory / n).is_file())
    files = {rel: file_sha256(directory / rel) for rel in listed}
    atomic_write_json(directory / CHECKSUMS_FILE, {"algorithm": "sha256", "files": files})
    return files


def verify_checksums(directory: str | os.PathLike[str]) -> bool:
    """Check every file ``checksums.json`` lists; a missing or changed file is a ``GptlabError`` naming it.

    Returns False where the checkpoint records no checksums (nothing to verify), True where all match.
    """
    import json

    directory = Path(directory)
    record_path = directory / CHECKSUMS_FILE
    if not record_path.is_file():
        return False
    try:
        record = json.loads(record_path.read_text(encoding="utf-8"))
        files = record["files"]
        if record.get("algorithm") != "sha256" or not isinstance(files, dict):
            raise ValueError("unknown layout")
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise GptlabError(f"{record_path}: not a valid checksum record (corrupt?): {exc}") from None
    for rel, expected in files.items():
        path = directory / rel
        if not path.is_file():
            raise GptlabError(f"{path}: missing, but {CHECKSUMS_FILE} lists it; the checkpoint is incomplete")
        try:
            actual = file_sha256(path)
        except OSError as exc:
            raise GptlabError(f"{path}: cannot be read ({exc.strerror or exc})") from None
        if actual != expected:
            raise GptlabError(
                f"{path}: SHA-256 differs from {CHECKSUMS_FILE} ({actual[:12]}…, recorded "
                f"{str(expected)[:12]}…); the file was changed or corrupted after it was saved"
            )
    return True
