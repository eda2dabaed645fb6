"""Checkpoints and run directories: the only module that reads or writes them.

A checkpoint is a directory::

    config.json         {"gptlab_format": 1, "model": GPTConfig.to_dict()}
    model.safetensors   the weights (a tied head is stored once, as wte.weight)
    tokenizer.json      optional: the tokenizer (JSON, see gptlab.tokenizers)

A run directory (written by ``gptlab train``) holds checkpoints ``ckpt-<step>/``;
each is written under a temporary name and renamed into place when complete, so a
``ckpt-*`` directory that exists is complete. ``load(RUN_DIR)`` takes the latest.

Every file is written atomically (temporary file, fsync, rename). Nothing is pickled.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write, atomic_write_json
from gptlab.model import GPT, GPTConfig

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
CKPT_PATTERN = re.compile(r"^ckpt-(\d+)$")


# ---------------------------------------------------------------- tensors
def write_tensors(
    path: str | os.PathLike[str], tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Atomically write a safetensors file (tensors are made contiguous and unshared)."""
    clean = {
        k: v.detach().contiguous().clone() if _shares_storage(v, tensors) else v.detach().contiguous()
        for k, v in tensors.items()
    }
    atomic_write(path, lambda tmp: save_file(clean, str(tmp), metadata=metadata))


def _shares_storage(t: torch.Tensor, tensors: dict[str, torch.Tensor]) -> bool:
    ptr = t.untyped_storage().data_ptr()
    return sum(1 for v in tensors.values() if v.untyped_storage().data_ptr() == ptr) > 1


def read_tensors(path: str | os.PathLike[str]) -> dict[str, torch.Tensor]:
    """Read a safetensors file; a missing or corrupt file is a ``GptlabError`` naming it."""
    path = Path(path)
    if not path.is_file():
        raise GptlabError(f"{path}: file not found")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise GptlabError(f"{path}: not a valid safetensors file (truncated or corrupt?): {exc}") from None


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; a missing or corrupt file is a ``GptlabError`` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GptlabError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GptlabError(f"{path}: not valid JSON (truncated or corrupt?): {exc}") from None


# ---------------------------------------------------------------- model
def model_state(model: GPT) -> dict[str, torch.Tensor]:
    """The model's weights as saved: a tied ``lm_head.weight`` is left out (it is ``wte.weight``)."""
    state = model.state_dict()
    if model.config.tie_embeddings:
        state.pop("lm_head.weight", None)
    return state


def load_model_state(model: GPT, state: dict[str, torch.Tensor], source: str | os.PathLike[str]) -> None:
    """Copy ``state`` into ``model``; a missing, extra or mis-shaped tensor names ``source``."""
    expected = model_state(model)
    missing = sorted(set(expected) - set(state))
    extra = sorted(set(state) - set(expected))
    if missing or extra:
        raise GptlabError(
            f"{source}: weights do not match config.json "
            f"(missing: {', '.join(missing[:5]) or 'none'}; unexpected: {', '.join(extra[:5]) or 'none'})"
        )
    for name, tensor in state.items():
        if tuple(tensor.shape) != tuple(expected[name].shape):
            raise GptlabError(
                f"{source}: tensor {name} has shape {tuple(tensor.shape)} but config.json "
                f"implies {tuple(expected[name].shape)}"
            )
    model.load_state_dict(state, strict=not model.config.tie_embeddings)


def write_config(path: str | os.PathLike[str], config: GPTConfig, **extra: Any) -> None:
    atomic_write_json(path, {"gptlab_format": FORMAT_VERSION, "model": config.to_dict(), **extra})


def read_config(path: str | os.PathLike[str]) -> GPTConfig:
    data = read_json(path)
    if not isinstance(data, dict) or "model" not in data or "gptlab_format" not in data:
        raise GptlabError(
            f"{path}: not a gptlab config.json (for a Hugging Face model use `gptlab convert --from-hf`)"
        )
    if data["gptlab_format"] != FORMAT_VERSION:
        raise GptlabError(
            f"{path}: checkpoint format {data['gptlab_format']} is not supported "
            f"(this gptlab reads format {FORMAT_VERSION})"
        )
    try:
        return GPTConfig.from_dict(data["model"])
    except GptlabError as exc:
        raise GptlabError(f"{path}: {exc}") from None


def save(model: GPT, tokenizer: Any | None, directory: str | os.PathLike[str]) -> Path:
    """Write ``model`` (and ``tokenizer``, if given) as a checkpoint directory."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise GptlabError(f"{directory}: exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)
    write_tensors(
        directory / WEIGHTS_FILE, model_state(model), metadata={"format": "pt", "gptlab_format": "1"}
    )
    if tokenizer is not None:
        tokenizer.save(directory / TOKENIZER_FILE)
    write_config(directory / CONFIG_FILE, model.config)
    return directory


def load(
    path: str | os.PathLike[str], device: str | torch.device = "cpu", dtype: torch.dtype | None = None
) -> tuple[GPT, Any | None]:
    """Read a checkpoint directory (or a run directory: its latest checkpoint) → ``(model, tokenizer_or_None)``."""
    directory = resolve_checkpoint(path)
    config = read_config(directory / CONFIG_FILE)
    state = read_tensors(directory / WEIGHTS_FILE)
    model = GPT(config)
    load_model_state(model, state, directory / WEIGHTS_FILE)
    if dtype is not None:
        model.to(dtype=dtype)
    model.to(device).eval()
    return model, load_tokenizer(directory)


def load_tokenizer(directory: str | os.PathLike[str]) -> Any | None:
    path = Path(directory) / TOKENIZER_FILE
    if not path.exists():
        return None
    from gptlab import tokenizers

    return tokenizers.load(path)


# ---------------------------------------------------------------- run directories
def list_checkpoints(run_dir: str | os.PathLike[str]) -> list[tuple[int, Path]]:
    """The complete checkpoints of a run directory, as ``(step, path)`` sorted by step."""
    run_dir = Path(run_dir)
    found = []
    for child in run_dir.iterdir() if run_dir.is_dir() else []:
        m = CKPT_PATTERN.match(child.name)
        if m and child.is_dir() and (child / CONFIG_FILE).is_file():
            found.append((int(m.group(1)), child))
    return sorted(found)


def resolve_checkpoint(path: str | os.PathLike[str]) -> Path:
    """A checkpoint directory itself, or the latest complete checkpoint of a run directory."""
    path = Path(path)
    if not path.exists():
        raise GptlabError(f"{path}: no such checkpoint or run directory")
    if not path.is_dir():
        raise GptlabError(f"{path}: a checkpoint is a directory holding {CONFIG_FILE} and {WEIGHTS_FILE}")
    if (path / CONFIG_FILE).exists() or (path / WEIGHTS_FILE).exists():
        return path
    ckpts = list_checkpoints(path)
    if not ckpts:
        raise GptlabError(
            f"{path}: holds neither a checkpoint ({CONFIG_FILE}, {WEIGHTS_FILE}) "
            f"nor any complete ckpt-<step> directory"
        )
    return ckpts[-1][1]


# ---------------------------------------------------------------- training state
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
    tokenizer: Any | None,
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
    run_dir.mkdir(parents=True, exist_ok=True)
    final = run_dir / f"ckpt-{step}"
    tmp = run_dir / f"{_TMP_PREFIX}ckpt-{step}-{os.getpid()}"
    if tmp.exists():
        _remove_tree(tmp)
    save(model, tokenizer, tmp)
    tensors: dict[str, torch.Tensor] = {}
    flat = flatten_state(state, "s", tensors)
    write_tensors(tmp / TRAIN_TENSORS_FILE, tensors, metadata={"format": "pt"})
    atomic_write_json(
        tmp / TRAIN_STATE_FILE,
        {"gptlab_format": FORMAT_VERSION, "step": step, "state": flat, **(extra or {})},
    )
    from gptlab.fileio import _fsync_dir

    _fsync_dir(tmp)
    if final.exists():  # re-saving a step (e.g. after a resume): swap the old one out first
        _discard(final)
    os.replace(tmp, final)
    _fsync_dir(run_dir)
    return final


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
