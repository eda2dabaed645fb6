"""``to_hf`` for every model gptlab builds: a transformers *remote-code* folder.

When no transformers class computes the model's function (``gptlab.interop.hf.FAMILIES``), the
folder carries the code itself::

    config.json              model_type "gptlab", "auto_map" → the classes below, "gptlab": the GPTConfig
    model.safetensors        the weights under "gpt." + gptlab's own names
    configuration_gptlab.py  GptlabConfig                       (gptlab/interop/remote/, copied)
    modeling_gptlab.py       GptlabForCausalLM / ForMaskedLM / ForSeq2SeqLM  (copied, + one import block)
    gptlab_*.py              gptlab.model and what it imports, generated (gptlab.interop.remote_source)

``AutoModelForCausalLM.from_pretrained(DIR, trust_remote_code=True)`` (a decoder),
``AutoModelForMaskedLM`` (an encoder) or ``AutoModelForSeq2SeqLM`` (an encoder–decoder) then loads it
without gptlab installed; ``AutoTokenizer.from_pretrained(DIR)`` needs no remote code. ``read_remote``
reads such a folder back (``gptlab.from_hf`` does, by its ``model_type``) without running its code.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from gptlab.checkpoint import load_model_state, model_state, write_tensors
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json, atomic_write_text
from gptlab.interop.common import CONFIG_FILE, SAFETENSORS_FILE, read_hf_weights
from gptlab.interop.remote_source import flat_name, generated_files, model_modules
from gptlab.model import GPT, GPTConfig, build_model

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

MODEL_TYPE = "gptlab"
PREFIX = "gpt."  # the wrapper holds the gptlab model as ``self.gpt``
TEMPLATES = ("configuration_gptlab.py", "modeling_gptlab.py")

#: GPTConfig.arch → (the class in modeling_gptlab.py, the transformers Auto class that loads it)
CLASSES: dict[str, tuple[str, str]] = {
    "decoder": ("GptlabForCausalLM", "AutoModelForCausalLM"),
    "encoder": ("GptlabForMaskedLM", "AutoModelForMaskedLM"),
    "encoder-decoder": ("GptlabForSeq2SeqLM", "AutoModelForSeq2SeqLM"),
}


def remote_architecture(model: GPT) -> str:
    """The transformers class name the folder's ``config.json`` names for ``model``."""
    return CLASSES[model.config.arch][0]


def auto_class(model: GPT) -> str:
    """The ``transformers`` Auto class that loads the exported ``model``."""
    return CLASSES[model.config.arch][1]


def _template(name: str) -> str:
    return resources.files("gptlab.interop.remote").joinpath(name).read_text(encoding="utf-8")


def code_files() -> dict[str, str]:
    """File name → text of every Python file of the folder: the templates and the generated model code.

    ``modeling_gptlab.py`` ends with a relative import of each generated module: transformers copies
    into its module cache only the files reached by ``from .x import`` lines, and a module that gptlab
    imports as ``from gptlab import configs`` is reached otherwise.
    """
    files = generated_files()
    block = "\n".join(
        f"from .{flat_name(m)} import __name__ as _{flat_name(m)}  # noqa: E402,F401" for m in model_modules()
    )
    files["configuration_gptlab.py"] = _template("configuration_gptlab.py")
    files["modeling_gptlab.py"] = (
        _template("modeling_gptlab.py")
        + "\n\n# Every generated module, so that transformers copies each into its module cache.\n"
        + block
        + "\n"
    )
    return files


def token_ids(model: GPT, tokenizer: Tokenizer | None) -> dict[str, int | None]:
    """bos/eos/pad (and the decoder's start) ids: the tokenizer's, else those an import recorded."""
    extra = model.config.extra
    eos = getattr(tokenizer, "eos_id", None) if tokenizer is not None else None
    eot = getattr(tokenizer, "eot_id", None) if tokenizer is not None else None
    eos = eos if eos is not None else eot if eot is not None else extra.get("eos_token_id")
    bos = getattr(tokenizer, "bos_id", None) if tokenizer is not None else extra.get("bos_token_id")
    ids: dict[str, int | None] = {"bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos}
    # gptlab's targets begin with <|endoftext|> (generate/driver.py)
    if model.config.arch == "encoder-decoder":
        ids["decoder_start_token_id"] = eot if eot is not None else eos
    return ids


def remote_config(model: GPT, tokenizer: Tokenizer | None = None) -> dict[str, Any]:
    """The ``config.json`` of a remote-code folder for ``model``."""
    cfg = model.config
    gptlab = cfg.to_dict() | {"vocab_multiple": 1}  # the file holds vocab_size rows, as gptlab saves them
    name, auto = CLASSES[cfg.arch]
    return {
        "architectures": [name],
        "model_type": MODEL_TYPE,
        "auto_map": {
            "AutoConfig": "configuration_gptlab.GptlabConfig",
            auto: f"modeling_gptlab.{name}",
        },
        "gptlab": gptlab,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.n_embd,
        "num_hidden_layers": cfg.n_layer,
        "num_attention_heads": cfg.n_head,
        "max_position_embeddings": cfg.block_size,
        "tie_word_embeddings": cfg.tie_embeddings,
        "is_encoder_decoder": cfg.arch == "encoder-decoder",
        "is_decoder": cfg.arch == "decoder",
        "use_cache": True,  # gptlab's own KVCache (modeling_gptlab.py)
        "dtype": str(model.dtype).removeprefix("torch."),
        **token_ids(model, tokenizer),
    }


def remote_tensors(model: GPT) -> dict[str, torch.Tensor]:
    """gptlab's state dict as saved (tied head left out), under the wrapper's ``gpt.`` prefix."""
    return {PREFIX + k: v.detach().to("cpu").contiguous() for k, v in model_state(model).items()}


def write_remote(model: GPT, directory: Path, tokenizer: Tokenizer | None = None) -> Path:
    """Write the remote-code folder of ``model`` into ``directory`` (which ``to_hf`` has checked)."""
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in code_files().items():
        atomic_write_text(directory / name, text)
    write_tensors(directory / SAFETENSORS_FILE, remote_tensors(model), metadata={"format": "pt"})
    atomic_write_json(directory / CONFIG_FILE, remote_config(model, tokenizer))
    return directory


def config_from_remote(hf: dict[str, Any], path: Path) -> GPTConfig:
    """The ``GPTConfig`` of a remote-code folder's ``config.json`` (its ``"gptlab"`` object)."""
    data = hf.get(MODEL_TYPE)
    if not isinstance(data, dict):
        raise GptlabError(f'{path}: model_type "gptlab" needs a "gptlab" object (the model\'s GPTConfig)')
    try:
        return GPTConfig.from_dict(data)
    except GptlabError as exc:
        raise GptlabError(f"{path}: {exc}") from None


def read_remote(directory: Path, hf: dict[str, Any], dtype: torch.dtype | None = None) -> GPT:
    """The model of a remote-code folder (eval mode, CPU), read as data: its Python files are not run."""
    config = config_from_remote(hf, directory / CONFIG_FILE)
    state, source = read_hf_weights(directory)
    foreign = sorted(k for k in state if not k.startswith(PREFIX))
    if foreign:
        raise GptlabError(f"{source}: tensor(s) {', '.join(foreign[:5])} are not under {PREFIX!r}")
    model = build_model(config)
    load_model_state(model, {k.removeprefix(PREFIX): v.float() for k, v in state.items()}, source)
    if dtype is not None:
        model.to(dtype=dtype)
    return model.eval()


__all__ = [
    "config_from_remote",
    "read_remote",
    "CLASSES",
    "MODEL_TYPE",
    "auto_class",
    "code_files",
    "remote_architecture",
    "remote_config",
    "token_ids",
    "write_remote",
]
