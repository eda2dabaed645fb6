"""Run directories: ``ckpt-<step>/`` training checkpoints (model + optimizer, RNG and counters), written
under a temporary name and renamed into place, so a ``ckpt-*`` directory that exists is complete."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gptlab.checkpoint.files import FORMAT_VERSION, read_json, read_tensors, write_tensors
from gptlab.checkpoint.files import list_checkpoints as list_checkpoints
from gptlab.checkpoint.integrity import write_checksums
from gptlab.checkpoint.model import write_files
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json, fsync_dir
from gptlab.model import GPT

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

TRAIN_TENSORS_FILE = "train_state.safetensors"
TRAIN_STATE_FILE = "train_state.json"
_TMP_PREFIX = ".tmp-"
_TRASH_PREFIX = ".trash-"


def flatten_state(state: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """A nested state (e.g. ``optimizer.state_dict()``) → JSON with tensors moved into ``tensors``.

    Each tensor is replaced by ``{"__tensor__": key}``; ``unflatten_state`` reverses it. Nothing is pickled.
    """
    if isinstance(state, torch.Tensor):
        key = prefix
        tensors[key] = state.detach().cpu().contiguous()
        return {"__tensor__": key}
    if isinstance(state, dict):
        return {
            "__dict__": [
                [flatten_state(k, f"{prefix}.k{i}", tensors), flatten_state(v, f"{prefix}.{i}", tensors)]
                for i, (k, v) in enumerate(state.items())
            ]
        }
    if isinstance(state, list | tuple):
        return {
            "__list__": [flatten_state(v, f"{prefix}.{i}", tensors) for i, v in enumerate(state)],
            "tuple": isinstance(state, tuple),
        }
    if state is None or isinstance(state, bool | int | float | str):
        return state
    raise GptlabError(
        f"cannot store a {type(state).__name__} in a checkpoint (only tensors, numbers, strings, "
        f"lists and dicts)"
    )


def unflatten_state(data: Any, tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of ``flatten_state``."""
    if isinstance(data, dict):
        if "__tensor__" in data:
            return tensors[data["__tensor__"]]
        if "__dict__" in data:
            return {unflatten_state(k, tensors): unflatten_state(v, tensors) for k, v in data["__dict__"]}
        if "__list__" in data:
            items = [unflatten_state(v, tensors) for v in data["__list__"]]
            return tuple(items) if data.get("tuple") else items
    return data


def save_training_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    model: GPT,
    tokenizer: Tokenizer | None,
    state: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Path:
    """Write ``RUN_DIR/ckpt-<step>/``: the model checkpoint plus the training state.

    ``state`` (optimizer states, RNG states, counters: tensors and plain values) goes
    to ``train_state.safetensors`` + ``train_state.json``; ``extra`` (JSON) is merged
    into the JSON. The directory is written under a temporary name, fsynced and renamed,
    so a ``ckpt-<step>`` directory that exists is complete.
    """
    run_dir = Path(run_dir)
    final = run_dir / f"ckpt-{step}"
    tmp = run_dir / f"{_TMP_PREFIX}ckpt-{step}-{os.getpid()}"
    with saving_checkpoint(run_dir, step, tmp):
        run_dir.mkdir(parents=True, exist_ok=True)
        if tmp.exists():
            _remove_tree(tmp)
        write_files(model, tokenizer, tmp)
        tensors: dict[str, torch.Tensor] = {}
        flat = flatten_state(state, "s", tensors)
        write_tensors(tmp / TRAIN_TENSORS_FILE, tensors, metadata={"format": "pt"})
        atomic_write_json(
            tmp / TRAIN_STATE_FILE,
            {"gptlab_format": FORMAT_VERSION, "step": step, "state": flat, **(extra or {})},
        )
        write_checksums(tmp)  # last: every file above, as written
        publish(tmp, final)
    return final


def publish(tmp: Path, final: Path) -> None:
    """fsync the finished ``tmp`` directory and rename it to ``final`` (an older ``final`` is swapped out)."""
    fsync_dir(tmp)
    if final.exists():  # re-saving a step (e.g. after a resume): swap the old one out first
        _discard(final)
    os.replace(tmp, final)
    fsync_dir(final.parent)


@contextlib.contextmanager
def saving_checkpoint(run_dir: Path, step: int, tmp: Path) -> Iterator[None]:
    """An I/O error while writing ``ckpt-<step>`` (a full disk, a quota, a permission) becomes one
    ``GptlabError`` line; the half-written ``tmp`` is removed and the earlier checkpoints stay as they were."""
    try:
        yield
    except OSError as exc:
        _remove_tree(tmp)
        raise io_stop(exc, run_dir, f"cannot write checkpoint ckpt-{step} in {run_dir}") from None


def io_stop(exc: OSError, run_dir: str | os.PathLike[str], what: str) -> GptlabError:
    """One line for a run stopped by an I/O error: ``what``, the reason, and where to go on from."""
    latest = list_checkpoints(run_dir)
    kept = (
        f"the latest checkpoint, {latest[-1][1].name}, is intact; free space and continue with "
        f"gptlab train --out {run_dir} --resume"
        if latest
        else "no checkpoint was written yet"
    )
    reason = exc.strerror or str(exc) or type(exc).__name__
    return GptlabError(f"{what}: {reason}; {kept}")


def read_training_checkpoint(directory: str | os.PathLike[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(state, info)`` of a training checkpoint: ``state`` as given to ``save_training_checkpoint``,
    ``info`` the rest of ``train_state.json``."""
    directory = Path(directory)
    info = read_json(directory / TRAIN_STATE_FILE)
    if not isinstance(info, dict) or "state" not in info:
        raise GptlabError(f"{directory / TRAIN_STATE_FILE}: not a gptlab training state")
    tensors = read_tensors(directory / TRAIN_TENSORS_FILE)
    try:
        state = unflatten_state(info.pop("state"), tensors)
    except KeyError as exc:
        raise GptlabError(f"{directory}: training state refers to a missing tensor {exc}") from None
    return state, info


def clean_incomplete(run_dir: str | os.PathLike[str]) -> None:
    """Remove half-written (``.tmp-*``) and half-deleted (``.trash-*``) checkpoints left by a killed run."""
    run_dir = Path(run_dir)
    for child in run_dir.iterdir() if run_dir.is_dir() else []:
        if child.name.startswith((_TMP_PREFIX + "ckpt-", _TRASH_PREFIX + "ckpt-")):
            _remove_tree(child)


def prune_checkpoints(
    run_dir: str | os.PathLike[str], keep_last: int, protect: set[int] | None = None
) -> list[int]:
    """Delete all but the last ``keep_last`` checkpoints and those in ``protect`` (e.g. the best); return
    the deleted steps. Each is renamed out of the ``ckpt-*`` namespace before removal."""
    ckpts = list_checkpoints(run_dir)
    keep = {step for step, _ in ckpts[-max(keep_last, 1) :]} | set(protect or ())
    removed = []
    for step, path in ckpts:
        if step not in keep:
            _discard(path)
            removed.append(step)
    return removed


def _discard(path: Path) -> None:
    trash = path.parent / f"{_TRASH_PREFIX}{path.name}-{os.getpid()}"
    os.replace(path, trash)
    _remove_tree(trash)


def _remove_tree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)
