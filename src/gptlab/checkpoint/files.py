"""Files inside a checkpoint (safetensors for tensors, JSON for everything else, both written atomically),
and where a checkpoint is: a directory itself, or the latest complete ``ckpt-<step>`` of a run directory."""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write, atomic_write_json
from gptlab.model.config import GPTConfig

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
CKPT_PATTERN = re.compile(r"^ckpt-(\d+)$")


def write_tensors(
    path: str | os.PathLike[str], tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> None:
    """Atomically write a safetensors file (tensors are made contiguous and unshared)."""
    clean = {
        k: v.detach().contiguous().clone() if _shares_storage(v, tensors) else v.detach().contiguous()
        for k, v in tensors.items()
    }
    atomic_write(path, lambda tmp: _save_file(clean, tmp, metadata))


def _save_file(tensors: dict[str, torch.Tensor], tmp: Path, metadata: dict[str, str] | None) -> None:
    """``safetensors.save_file``, whose I/O errors (``File too large (os error 27)``) become ``OSError``."""
    try:
        save_file(tensors, str(tmp), metadata=metadata)
    except SafetensorError as exc:
        found = re.search(r"os error (\d+)", str(exc))
        code = int(found.group(1)) if found else errno.EIO
        raise OSError(code, os.strerror(code) if found else str(exc), str(tmp)) from None


def _shares_storage(t: torch.Tensor, tensors: dict[str, torch.Tensor]) -> bool:
    ptr = t.untyped_storage().data_ptr()
    return sum(1 for v in tensors.values() if v.untyped_storage().data_ptr() == ptr) > 1


def read_tensors(path: str | os.PathLike[str], device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Read a safetensors file onto ``device`` (straight there: no CPU copy on the way to a GPU);
    a missing or corrupt file is a ``GptlabError`` naming it."""
    path = Path(path)
    if not path.is_file():
        raise GptlabError(f"{path}: file not found")
    try:
        return load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise GptlabError(f"{path}: not a valid safetensors file (truncated or corrupt?): {exc}") from None


class LazyTensors(Mapping[str, torch.Tensor]):
    """Named tensors made only when asked for (``lazy[name]`` runs its maker each time).

    What quantizing while loading reads: one tensor at a time, so that a whole float32 model never
    has to exist in memory (``gptlab.model.load_quantized``).
    """

    def __init__(self, makers: dict[str, Callable[[], torch.Tensor]]) -> None:
        self._makers = makers

    def __getitem__(self, name: str) -> torch.Tensor:
        return self._makers[name]()

    def __contains__(self, name: object) -> bool:  # Mapping's own would make the tensor to find out
        return name in self._makers

    def __iter__(self) -> Iterator[str]:
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def read_tensors_lazily(path: str | os.PathLike[str]) -> LazyTensors:
    """A safetensors file as ``LazyTensors``: each tensor is read from the file into its own memory when
    asked for (with ordinary reads: a memory map would keep every page read so far in the process)."""
    path = Path(path)
    if not path.is_file():
        raise GptlabError(f"{path}: file not found")
    try:
        with safe_open(str(path), framework="pt") as handle:  # checks the header
            names = list(handle.keys())
        with path.open("rb") as f:
            size = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(size))
    except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
        raise GptlabError(f"{path}: not a valid safetensors file (truncated or corrupt?): {exc}") from None

    def read(name: str) -> torch.Tensor:
        entry = header[name]
        start, end = entry["data_offsets"]
        out = torch.empty(entry["shape"], dtype=SAFETENSORS_DTYPES[entry["dtype"]])
        with path.open("rb") as f:
            f.seek(8 + size + start)
            buffer = out.view(-1).view(torch.uint8).numpy()
            # numpy's stubs declare ndarray.__buffer__ only for Python ≥ 3.12 (mypy checks as 3.11)
            if f.readinto(buffer) != end - start:  # type: ignore[arg-type]
                raise GptlabError(f"{path}: tensor {name} is cut short (truncated file?)")
        return out

    return LazyTensors({name: partial(read, name) for name in names})


#: safetensors dtype names → torch dtypes.
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip


def read_json(path: str | os.PathLike[str]) -> Any:
    """Read a JSON file; a missing or corrupt file is a ``GptlabError`` naming it."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise GptlabError(f"{path}: file not found") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise GptlabError(f"{path}: not valid JSON (truncated or corrupt?): {exc}") from None


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


SHARDED_DIR = "sharded"  # the DCP shards of an FSDP checkpoint (``gptlab.checkpoint.sharded``)


def is_sharded(directory: str | os.PathLike[str]) -> bool:
    """True for a checkpoint whose weights are DCP shards (no ``model.safetensors``)."""
    directory = Path(directory)
    return (directory / SHARDED_DIR).is_dir() and not (directory / WEIGHTS_FILE).is_file()


def require_consolidated(directory: str | os.PathLike[str]) -> None:
    """A one-line error for commands that need ``model.safetensors`` but were given a sharded checkpoint."""
    if is_sharded(directory):
        raise GptlabError(
            f"{directory}: a sharded (FSDP) checkpoint; make a single-file one first: "
            f"gptlab convert --consolidate {directory} --out CKPT"
        )


def write_config(path: str | os.PathLike[str], config: GPTConfig, **extra: Any) -> None:
    atomic_write_json(path, {"gptlab_format": FORMAT_VERSION, "model": config.to_dict(), **extra})
