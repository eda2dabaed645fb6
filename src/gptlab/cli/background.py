"""The background compilation that ``sample``, ``chat`` and ``serve`` start under ``--compile auto``
where the compile cache lacks the one-row step (``compile_later``): ``gptlab compile`` (``gptlab.cli.compile``)
detached, once per step's folder, its output in ``compile.log`` there; ``building.json`` names the
running process, ``failed.json`` a step that cannot be compiled or kept (no later command tries again)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gptlab.generate.prepared import PreparedDecoding

BUILDING, FAILED, LOG = "building.json", "failed.json", "compile.log"
#: a ``building.json`` older than this is stale (its process died without removing it)
STALE_S = 3600


@dataclass(frozen=True)
class Later:
    """What a background ``gptlab compile`` needs to build the step a command will load: the model
    source, its resolved weight format (``keep``: a GGUF file's own) and the weights cache."""

    checkpoint: str
    weights: str
    weights_cache: str | None


def compile_later(engine: PreparedDecoding, later: Later) -> str:
    """Start ``gptlab compile`` for ``engine``'s model in the background, unless one is running or
    failed before → the ``compile:`` line's words for what was done. A compile cache that cannot be
    written, or a process that cannot be started, costs the words, never the command."""
    try:
        return _compile_later(engine, later)
    except OSError as exc:
        return f"not compiled for later processes: {type(exc).__name__}: {exc}"


def _compile_later(engine: PreparedDecoding, later: Later) -> str:
    import torch

    folder = engine.step_folder()
    assert folder is not None and engine.settings.compile_cache is not None
    failed = folder / FAILED
    if failed.is_file():
        try:
            why = str(json.loads(failed.read_text()).get("why", ""))
        except (OSError, ValueError, AttributeError):
            why = "its record is unreadable"
        return f"not compiled for later processes: an earlier try failed ({why}; delete {failed} to retry)"
    folder.mkdir(parents=True, exist_ok=True)
    claim = _claim(folder / BUILDING)
    if claim is not None:
        return f"being compiled for later processes by process {claim}"
    command = [
        sys.executable,
        "-m",
        "gptlab",
        "compile",
        later.checkpoint,
        "--dtype",
        "auto" if later.weights == "keep" else later.weights,
        "--threads",
        str(torch.get_num_threads()),
        "--compile-cache",
        engine.settings.compile_cache,
        "--weights-cache",
        later.weights_cache or "none",
        "--background",
    ]
    pid = start(command, folder / LOG)
    from gptlab.fileio import atomic_write_json

    atomic_write_json(folder / BUILDING, {"pid": pid, "at": time.time()})
    return f"compiling it for later processes in the background (process {pid}, log {folder / LOG})"


def start(command: list[str], log: Path) -> int:
    """Run ``command`` detached (a session of its own, which outlives this one; no terminal input),
    its output appended to ``log`` → its pid."""
    with open(log, "ab") as out:
        child = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True
        )
    return child.pid


def _claim(path: Path) -> int | None:
    """Take ``building.json`` for this process → None; or the pid of a live process that holds it."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            held = json.loads(path.read_text())
            pid, at = int(held["pid"]), float(held["at"])
        except (OSError, ValueError, KeyError, TypeError):
            pid, at = 0, 0.0
        if pid and time.time() - at < STALE_S and _alive(pid):
            return pid
        path.unlink(missing_ok=True)  # stale: its process is gone
        return _claim(path)
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": os.getpid(), "at": time.time()}, f)
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
