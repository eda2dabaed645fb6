"""Shared machinery for Hugging Face conversion: reading a directory, renaming tensors.

A *family* (GPT-2, Llama) is described by a ``Family`` object: how to read and
write its ``config.json`` and a table of ``Rule``s, each naming one gptlab tensor
and the Hugging Face tensor(s) it corresponds to, with the two transforms between
them (copy, transpose, concatenate/split). ``import_state`` and ``export_state``
apply a table in either direction; nothing here knows about a particular family.

No ``transformers`` import: the configs and names are mapped by hand, so reading
and writing needs only ``torch`` and ``safetensors``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from pickle import UnpicklingError  # raised by torch.load(weights_only=True) on a refused or corrupt file
from typing import Any

import torch

from gptlab.checkpoint import read_json, read_tensors
from gptlab.checkpoint.files import LazyTensors
from gptlab.errors import GptlabError
from gptlab.model import GPTConfig

CONFIG_FILE = "config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
BIN_FILE = "pytorch_model.bin"
BIN_INDEX = "pytorch_model.bin.index.json"

Tensors = dict[str, torch.Tensor]


# ------------------------------------------------------------------ rules
def _copy_in(ts: list[torch.Tensor], cfg: GPTConfig) -> torch.Tensor:
    return ts[0]


def _copy_out(t: torch.Tensor, cfg: GPTConfig) -> list[torch.Tensor]:
    return [t]


def _transpose_in(ts: list[torch.Tensor], cfg: GPTConfig) -> torch.Tensor:
    return ts[0].t()


def _transpose_out(t: torch.Tensor, cfg: GPTConfig) -> list[torch.Tensor]:
    return [t.t()]


def _cat_in(ts: list[torch.Tensor], cfg: GPTConfig) -> torch.Tensor:
    return torch.cat(ts, dim=0)


def _split_qkv_out(t: torch.Tensor, cfg: GPTConfig) -> list[torch.Tensor]:
    assert cfg.n_kv_head is not None
    q_dim, kv_dim = cfg.n_head * cfg.head_dim, cfg.n_kv_head * cfg.head_dim
    return list(t.split([q_dim, kv_dim, kv_dim], dim=0))


@dataclass(frozen=True)
class Transform:
    """A pair of inverse maps between Hugging Face tensors and one gptlab tensor."""

    name: str  # for the docs: "copy", "transpose", "concatenate"
    to_ours: Callable[[list[torch.Tensor], GPTConfig], torch.Tensor]
    to_theirs: Callable[[torch.Tensor, GPTConfig], list[torch.Tensor]]


COPY = Transform("copy", _copy_in, _copy_out)
TRANSPOSE = Transform("transpose (Conv1D stores W as in×out)", _transpose_in, _transpose_out)
FUSE_QKV = Transform("concatenate q, k, v along the output dim", _cat_in, _split_qkv_out)


@dataclass(frozen=True)
class Rule:
    """gptlab tensor ``ours`` ↔ Hugging Face tensor(s) ``theirs``; ``{i}`` is the layer index.

    ``zero_if_absent``: a bias that the Hugging Face config may switch off (Llama's
    ``attention_bias``/``mlp_bias``); when it is absent on import it is zero, which
    computes the same function.
    """

    ours: str
    theirs: tuple[str, ...]
    transform: Transform = COPY
    zero_if_absent: bool = False


def rule(ours: str, *theirs: str, transform: Transform = COPY, zero_if_absent: bool = False) -> Rule:
    return Rule(ours, tuple(theirs), transform, zero_if_absent)


def expand(rules: Iterable[Rule], layer_rules: Iterable[Rule], n_layer: int) -> list[Rule]:
    """Global rules plus the per-layer rules for layers ``0..n_layer-1`` (``{i}`` filled in)."""
    out = list(rules)
    for i in range(n_layer):
        out.extend(
            Rule(r.ours.format(i=i), tuple(t.format(i=i) for t in r.theirs), r.transform, r.zero_if_absent)
            for r in layer_rules
        )
    return out


# ------------------------------------------------------------------ family
@dataclass(frozen=True)
class Family:
    """Everything needed to convert one Hugging Face architecture in both directions.

    * ``config_from_hf(hf_config, path) -> GPTConfig`` (raises ``GptlabError`` for
      settings gptlab cannot represent);
    * ``config_to_hf(GPTConfig) -> dict`` (the ``config.json`` to write);
    * ``export_requires``: gptlab option → (does ``cfg`` meet it?, what it needs);
      ``to_hf`` picks the first family whose requirements a model meets;
    * ``rules`` / ``layer_rules``: the tensor name table;
    * ``prefix``: the base-model prefix (``transformer.``, ``model.``), absent in
      directories saved from the bare base model;
    * ``ignore``: suffixes of buffers that old checkpoints carry and that hold no weights.
    """

    name: str
    model_type: str
    architecture: str
    config_from_hf: Callable[[dict[str, Any], Path], GPTConfig]
    config_to_hf: Callable[[GPTConfig], dict[str, Any]]
    export_requires: dict[str, tuple[Callable[[GPTConfig], bool], str]]
    rules: tuple[Rule, ...]
    layer_rules: tuple[Rule, ...]
    prefix: str
    ignore: tuple[str, ...] = field(default_factory=tuple)

    def all_rules(self, cfg: GPTConfig) -> list[Rule]:
        return expand(self.rules, self.layer_rules, cfg.n_layer)

    def export_problems(self, cfg: GPTConfig) -> list[str]:
        """The options of ``cfg`` this family cannot represent, each as ``"what it needs (not value)"``."""
        return [
            f"{needs} (not {getattr(cfg, name)!r})"
            for name, (ok, needs) in self.export_requires.items()
            if not ok(cfg)
        ]


# ------------------------------------------------------------------ reading
def read_hf_config(directory: Path) -> dict[str, Any]:
    """``config.json`` of a Hugging Face model directory, as a dict."""
    path = directory / CONFIG_FILE
    if not directory.is_dir():
        raise GptlabError(
            f"{directory}: not a directory (expected a Hugging Face model folder with "
            f"{CONFIG_FILE} and {SAFETENSORS_FILE} or {BIN_FILE})"
        )
    data = read_json(path)
    if not isinstance(data, dict):
        raise GptlabError(f"{path}: a Hugging Face config must be a JSON object")
    if "gptlab_format" in data:
        raise GptlabError(
            f"{path}: this is a gptlab checkpoint, not a Hugging Face model; "
            f"load it with gptlab.load (or convert it with `gptlab convert --to-hf`)"
        )
    return data


def read_hf_weights(directory: Path) -> tuple[Tensors, Path]:
    """All tensors of a Hugging Face model directory and the file (or index) they came from.

    Looks for, in order: ``model.safetensors``, ``model.safetensors.index.json``
    (shards), ``pytorch_model.bin``, ``pytorch_model.bin.index.json``. ``.bin``
    files are read with ``torch.load(weights_only=True)``: no code runs.
    """
    readers: dict[str, Callable[[Path], Tensors]] = {
        SAFETENSORS_FILE: read_tensors,
        SAFETENSORS_INDEX: lambda p: _read_sharded(p, read_tensors),
        BIN_FILE: read_bin,
        BIN_INDEX: lambda p: _read_sharded(p, read_bin),
    }
    for name, reader in readers.items():
        path = directory / name
        if path.exists():
            return reader(path), path
    raise GptlabError(f"{directory}: no weights found; expected one of {', '.join(readers)}")


def read_bin(path: Path) -> Tensors:
    """A ``pytorch_model.bin`` state dict, loaded with ``weights_only=True`` (no arbitrary code)."""
    try:
        state = torch.load(path, weights_only=True, map_location="cpu")
    except FileNotFoundError:
        raise GptlabError(f"{path}: file not found") from None
    except (RuntimeError, EOFError, OSError, ValueError, UnpicklingError) as exc:
        msg = " ".join(str(exc).split())[:300]
        raise GptlabError(
            f"{path}: cannot read this PyTorch weights file (truncated, corrupt, or holds more "
            f"than tensors?): {msg}"
        ) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise GptlabError(f"{path}: expected a dict of tensor name → tensor")
    return state


def _read_sharded(index_path: Path, reader: Callable[[Path], Tensors]) -> Tensors:
    index = read_json(index_path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise GptlabError(f'{index_path}: expected a JSON object with a non-empty "weight_map"')
    state: Tensors = {}
    for shard in sorted(set(weight_map.values())):
        shard_path = index_path.parent / str(shard)
        if Path(str(shard)).is_absolute() or ".." in Path(str(shard)).parts:
            raise GptlabError(f"{index_path}: shard name {shard!r} must be a file in the same directory")
        state.update(reader(shard_path))
    missing = sorted(set(weight_map) - set(state))
    if missing:
        raise GptlabError(
            f"{index_path}: the shards lack tensor(s) listed in the index: {', '.join(missing[:5])}"
        )
    return state


# ------------------------------------------------------------------ state dicts
def normalise_names(state: Tensors, family: Family) -> Tensors:
    """Add the base-model prefix if the directory was saved from the bare base model; drop buffers."""
    state = {k: v for k, v in state.items() if not k.endswith(family.ignore)}
    if any(k.startswith(family.prefix) for k in state):
        return state
    return {k if k.startswith("lm_head.") else family.prefix + k: v for k, v in state.items()}


def import_state(
    family: Family, cfg: GPTConfig, hf_state: Mapping[str, torch.Tensor], expected: Tensors, source: Path
) -> Tensors:
    """Map Hugging Face tensors to the gptlab names of ``expected`` (the new model's state dict)."""
    return dict(import_lazy(family, cfg, hf_state, expected, source).items())


def import_lazy(
    family: Family, cfg: GPTConfig, hf_state: Mapping[str, torch.Tensor], expected: Tensors, source: Path
) -> LazyTensors:
    """``import_state`` one tensor at a time: names are checked now, each tensor is made when asked for."""
    makers: dict[str, Callable[[], torch.Tensor]] = {}
    used: set[str] = set()
    for r in family.all_rules(cfg):
        if r.ours not in expected:
            continue
        present = [t in hf_state for t in r.theirs]
        if not all(present):
            if r.zero_if_absent and not any(present):
                shape, dtype = expected[r.ours].shape, expected[r.ours].dtype
                makers[r.ours] = partial(torch.zeros, shape, dtype=dtype)
                continue
            missing = [t for t, p in zip(r.theirs, present) if not p]
            raise GptlabError(
                f"{source}: missing tensor {', '.join(missing)} (config.json describes "
                f"{cfg.n_layer} layers of a {family.name} model)"
            )
        used.update(r.theirs)
        makers[r.ours] = partial(_apply_rule, r, cfg, hf_state, tuple(expected[r.ours].shape), source)
    unexpected = sorted(set(hf_state) - used - ({"lm_head.weight"} if cfg.tie_embeddings else set()))
    if unexpected:
        raise GptlabError(
            f"{source}: unexpected tensor(s) {', '.join(unexpected[:5])}"
            f"{' …' if len(unexpected) > 5 else ''}; this is not a plain {family.architecture}"
        )
    return LazyTensors(makers)


def _apply_rule(
    r: Rule, cfg: GPTConfig, hf_state: Mapping[str, torch.Tensor], shape: tuple[int, ...], source: Path
) -> torch.Tensor:
    """The gptlab tensor of rule ``r``, made from its Hugging Face tensors and checked against ``shape``."""
    tensors = [hf_state[t] for t in r.theirs]
    try:
        tensor = r.transform.to_ours(tensors, cfg)
    except RuntimeError as exc:
        shapes = ", ".join(f"{t} {tuple(x.shape)}" for t, x in zip(r.theirs, tensors, strict=True))
        raise GptlabError(f"{source}: tensor shapes do not match config.json ({shapes}): {exc}") from None
    if tuple(tensor.shape) != shape:
        shapes = ", ".join(f"{t} {tuple(x.shape)}" for t, x in zip(r.theirs, tensors, strict=True))
        raise GptlabError(
            f"{source}: {shapes} does not match config.json, which implies {shape} for {r.ours}"
        )
    return tensor.contiguous()


def export_state(family: Family, cfg: GPTConfig, state: Tensors) -> Tensors:
    """Map a gptlab state dict (tied head left out) to Hugging Face names."""
    out: Tensors = {}
    for r in family.all_rules(cfg):
        if r.ours in state:
            for name, tensor in zip(r.theirs, r.transform.to_theirs(state[r.ours], cfg), strict=True):
                out[name] = tensor.detach().to("cpu").contiguous()
    left = sorted(set(state) - {r.ours for r in family.all_rules(cfg)})
    if left:  # a bug, not bad input: every tensor of an exportable model has a rule
        raise AssertionError(f"no {family.name} name for {', '.join(left)}")
    return out
