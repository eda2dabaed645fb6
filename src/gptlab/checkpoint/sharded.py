"""Sharded training checkpoints through ``torch.distributed.checkpoint`` (DCP): every rank writes its shard.

A sharded checkpoint is a ``ckpt-<step>/`` directory like any other, except that the weights
and optimizer state live in ``sharded/`` instead of ``model.safetensors``::

    config.json           the model (as every checkpoint)
    tokenizer.json
    train_state.json      step, counters, and the optimizer's non-tensor state (JSON)
    checksums.json        the SHA-256 of every file above and of every rank's shard (verified on load)
    sharded/shard-0000R-model-00001-of-00001.safetensors   rank R's shards, with their offsets

The files are safetensors (DCP's ``HuggingFaceStorageWriter``): no pickle, and each tensor
piece records where it sits in the full tensor, so a checkpoint written by ``W`` ranks loads
on any number of ranks (DCP reads the pieces each rank's shards overlap) or on one process.
Each rank's RNG state is stored under ``rng.rank<r>``; a rank that did not exist when the
checkpoint was written is seeded from ``seed + step + rank``.

The whole directory is written under ``.tmp-ckpt-<step>-sharded`` by every rank, fsynced,
and renamed by rank 0 once all ranks have finished and it has recorded every file's SHA-256, so a
crash mid-save (or a SIGKILL of every rank) leaves the previous checkpoint as the latest complete one.
An I/O error on any rank is agreed on by all of them and raised as one ``GptlabError``.
``consolidate`` gathers one into a single-file checkpoint (``gptlab convert --consolidate RUN
--out CKPT``) that every other command reads.
"""

from __future__ import annotations

import errno
import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from gptlab.checkpoint.files import (
    CONFIG_FILE,
    FORMAT_VERSION,
    SHARDED_DIR,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    is_sharded,
    read_json,
    resolve_checkpoint,
    write_config,
)
from gptlab.checkpoint.integrity import verify_checksums, write_checksums
from gptlab.checkpoint.model import (
    context_extra,
    load_tokenizer,
    read_config,
    save,
    usable_config,
)
from gptlab.checkpoint.run import TRAIN_STATE_FILE, publish, saving_checkpoint, unflatten_state
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json, fsync_dir
from gptlab.model.state_dict import load_model_state, model_state

if TYPE_CHECKING:
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    from gptlab.model import GPT
    from gptlab.tokenizers.base import Tokenizer

_TMP_SUFFIX = "-sharded"


class RankInfo(Protocol):
    """This process's place in the group (``gptlab.train.distributed.DistInfo``)."""

    rank: int
    world_size: int
    device: str

    @property
    def is_main(self) -> bool: ...


def _flatten(obj: Any, prefix: str, tensors: dict[str, torch.Tensor]) -> Any:
    """Nested state → JSON (the markers of ``checkpoint.run.flatten_state``) with tensors left in ``tensors``.

    Tensors stay where they are (sharded DTensors stay sharded), keyed by their path:
    ``optim.state.blocks.0.attn.qkv.weight.exp_avg``.
    """
    if isinstance(obj, torch.Tensor):
        tensors[prefix.lstrip(".")] = obj
        return {"__tensor__": prefix.lstrip(".")}
    if isinstance(obj, dict):
        return {"__dict__": [[k, _flatten(v, f"{prefix}.{k}", tensors)] for k, v in obj.items()]}
    if isinstance(obj, list | tuple):
        items = [_flatten(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
        return {"__list__": items, "tuple": isinstance(obj, tuple)}
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    raise GptlabError(f"cannot store a {type(obj).__name__} at {prefix} in a sharded checkpoint")


def _optimizers(optimizer: Any) -> list[torch.optim.Optimizer]:
    return list(getattr(optimizer, "optimizers", {"": optimizer}).values())


def _state(model: torch.nn.Module, optimizer: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """``(JSON skeleton, tensors)`` of the model and optimizer, keyed by parameter names (FQNs)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_sd, optim_sd = get_state_dict(model, _optimizers(optimizer))
    if _tied(model):  # one tensor under two names: stored once, as wte.weight
        model_sd.pop(TIED_HEAD, None)
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _flatten({"model": model_sd, "optim": optim_sd}, "", tensors)
    return skeleton, tensors


TIED_HEAD = "lm_head.weight"


def _tied(model: torch.nn.Module) -> bool:
    return bool(getattr(getattr(model, "config", None), "tie_embeddings", False))


def _rng_keys(rank: int, device_type: str) -> dict[str, Any]:
    keys: dict[str, Any] = {f"rng.rank{rank}": torch.get_rng_state}
    if device_type == "cuda":
        keys[f"rng_cuda.rank{rank}"] = torch.cuda.get_rng_state
    return keys


def _no_dist() -> bool:
    return not (dist.is_available() and dist.is_initialized())


def save_training_checkpoint(
    run_dir: str | os.PathLike[str],
    step: int,
    model: GPT,
    optimizer: Any,
    tokenizer: Tokenizer | None,
    info: RankInfo,
    extra: dict[str, Any] | None = None,
) -> Path:
    """Every rank calls this: write ``RUN_DIR/ckpt-<step>/`` with each rank's shards, atomically as a whole.

    An I/O error on any rank (a full disk …) is one ``GptlabError`` on every rank; the half-written
    directory goes and the earlier checkpoints stay as they were."""
    import torch.distributed as dist

    run_dir = Path(run_dir)
    final, tmp = run_dir / f"ckpt-{step}", run_dir / f".tmp-ckpt-{step}{_TMP_SUFFIX}"
    failure: OSError | None = None
    try:
        with saving_checkpoint(run_dir, step, tmp):
            try:
                skeleton = _write_shards(tmp, model, optimizer, info)
                if info.is_main:
                    _write_rest(
                        tmp, model, tokenizer, {"world_size": info.world_size, "state": skeleton}, step, extra
                    )
                    write_checksums(tmp)  # every rank's shards and the files above, as written
            except OSError as exc:
                failure = exc
            _agree(failure, info)  # every rank learns of one rank's failure (none waits in a collective)
            if failure is not None:
                raise failure
            if info.is_main:
                publish(tmp, final)
    finally:
        if not _no_dist():
            dist.barrier()  # the rename is seen by every rank before any goes on
    return final


def _write_shards(tmp: Path, model: GPT, optimizer: Any, info: RankInfo) -> Any:
    """Every rank writes its own shards (and RNG state) into ``tmp/sharded/`` through DCP; returns the
    JSON skeleton of the state."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageWriter
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    if info.is_main:
        _remove_tree(tmp)
        (tmp / SHARDED_DIR).mkdir(parents=True)
    if not _no_dist():
        dist.barrier()
    skeleton, tensors = _state(model, optimizer)
    device_type = torch.device(info.device).type
    tensors.update({k: get() for k, get in _rng_keys(info.rank, device_type).items()})
    writer = HuggingFaceStorageWriter(str(tmp / SHARDED_DIR), save_distributed=True)
    try:
        with warnings.catch_warnings():  # one process: DCP warns that it assumes so
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp_save(
                tensors, storage_writer=writer, no_dist=_no_dist()
            )  # returns once every rank has written
    except CheckpointException as exc:  # DCP gathers each rank's failure (a full disk …) into one exception
        lines = [line for line in str(exc).splitlines() if line.strip()]
        raise OSError(errno.EIO, lines[-1].strip() if lines else "a rank failed to write its shard") from None
    return skeleton


def _write_rest(
    tmp: Path,
    model: GPT,
    tokenizer: Tokenizer | None,
    layout: dict[str, Any],
    step: int,
    extra: dict[str, Any] | None,
) -> None:
    """The main rank writes the config, tokenizer and ``train_state.json`` beside the shards."""
    write_config(tmp / CONFIG_FILE, model.config, **context_extra(model))
    if tokenizer is not None:
        tokenizer.save(tmp / TOKENIZER_FILE)
    atomic_write_json(
        tmp / TRAIN_STATE_FILE,
        {
            "gptlab_format": FORMAT_VERSION,
            "step": step,
            "sharded": layout,
            **(extra or {}),
        },
    )
    fsync_dir(tmp / SHARDED_DIR)


def _agree(failure: OSError | None, info: RankInfo) -> None:
    """All ranks agree on whether the save failed: a rank's ``failure`` is raised (as ``OSError``) on all."""
    if _no_dist():
        return
    flag = torch.tensor([0.0 if failure is None else 1.0], device=info.device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if failure is None and flag.item() > 0:
        raise OSError(errno.EIO, "another rank failed to write its part")


def read_info(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """``train_state.json`` of a sharded checkpoint (step, counters, best, data fingerprint)."""
    info = read_json(Path(directory) / TRAIN_STATE_FILE)
    if not isinstance(info, dict) or not isinstance(info.get("sharded"), dict) or "step" not in info:
        raise GptlabError(f"{Path(directory) / TRAIN_STATE_FILE}: not a gptlab sharded training state")
    return info


def _reader(directory: Path) -> HuggingFaceStorageReader:
    from torch.distributed.checkpoint.hf_storage import HuggingFaceStorageReader

    files = sorted((directory / SHARDED_DIR).glob("*.safetensors"))
    if not files:
        raise GptlabError(f"{directory / SHARDED_DIR}: holds no shard files; the checkpoint is incomplete")
    return HuggingFaceStorageReader(str(directory / SHARDED_DIR))


def _load(directory: Path, tensors: dict[str, torch.Tensor]) -> None:
    """Fill ``tensors`` in place from the shards (each rank reads what its own pieces overlap)."""
    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    try:
        with warnings.catch_warnings():  # one process: DCP warns that it assumes so
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp_load(tensors, storage_reader=_reader(directory), no_dist=_no_dist())
    except GptlabError:
        raise
    except (Exception, CheckpointException) as exc:  # DCP wraps each rank's failure (a truncated shard …)
        first = str(exc).strip().splitlines()
        raise GptlabError(
            f"{directory / SHARDED_DIR}: cannot read the sharded checkpoint "
            f"({first[-1] if first else type(exc).__name__}); it is truncated or does not match this model"
        ) from None


def load_training_state(
    directory: str | os.PathLike[str], model: GPT, optimizer: Any, info: RankInfo, seed: int
) -> dict[str, Any]:
    """Every rank calls this: weights, optimizer and this rank's RNG, on any number of ranks; returns the info."""
    from torch.distributed.checkpoint.state_dict import set_state_dict

    directory = Path(directory)
    meta = read_info(directory)
    skeleton, tensors = _state(model, optimizer)
    saved = meta["sharded"]["state"]
    if _tensor_keys(saved) != set(tensors):  # the RNG keys are added below
        raise GptlabError(
            f"{directory}: the sharded state does not match this model and optimizer "
            f"(keep the model settings and optimizer when resuming)"
        )
    device_type = torch.device(info.device).type
    rng = {k: get() for k, get in _rng_keys(info.rank, device_type).items()}
    saved_ranks = int(meta["sharded"].get("world_size", 1))
    if info.rank < saved_ranks:
        tensors.update(rng)
    _load(directory, tensors)
    state = unflatten_state(saved, tensors)
    if _tied(model):
        state["model"][TIED_HEAD] = state["model"]["wte.weight"]
    set_state_dict(
        model, _optimizers(optimizer), model_state_dict=state["model"], optim_state_dict=state["optim"]
    )
    if info.rank < saved_ranks:
        torch.set_rng_state(tensors[f"rng.rank{info.rank}"])
        if device_type == "cuda":
            torch.cuda.set_rng_state(tensors[f"rng_cuda.rank{info.rank}"])
    else:
        torch.manual_seed(seed + info.rank)
    return meta


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def _tensor_keys(skeleton: Any) -> set[str]:
    """The tensor keys a JSON skeleton refers to."""
    if isinstance(skeleton, dict):
        if "__tensor__" in skeleton:
            return {skeleton["__tensor__"]}
        return set().union(*(_tensor_keys(v) for v in skeleton.values()), set())
    if isinstance(skeleton, list):
        return set().union(*(_tensor_keys(v) for v in skeleton), set())
    return set()


def consolidate(source: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """A sharded checkpoint (or a run directory's latest) → one ``model.safetensors`` checkpoint at ``out``."""
    from gptlab.model import GPT

    directory = resolve_checkpoint(source)
    verify_checksums(directory)
    if not is_sharded(directory):
        raise GptlabError(
            f"{directory}: not a sharded checkpoint (it already has {WEIGHTS_FILE}); nothing to consolidate"
        )
    read_info(directory)
    config = read_config(directory / CONFIG_FILE)
    with torch.device("cpu"):
        model = GPT(config)
    tensors = {f"model.{k}": v for k, v in model_state(model).items()}  # a tied head is wte.weight
    _load(directory, tensors)
    load_model_state(model, {k[len("model.") :]: v for k, v in tensors.items()}, directory)
    usable = usable_config(directory / CONFIG_FILE)  # a run fine-tuned on shorter windows keeps its context
    model.pretrained_context = usable.block_size
    return save(model, load_tokenizer(directory), out)
