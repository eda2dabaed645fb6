"""A prompt's pass kept compiled (CPU, one sequence): ``prompt_pass``, and ``KeptPrompt``, which runs it
from the package the compile cache keeps beside the one-row step.

A prompt of T tokens from position 0 is one forward pass that writes its keys and values into the
cache and gives the last position's logits,

    K, V[0, T) ← the prompt's keys and values;   logits_{T−1}

Run eagerly it is a few hundred library calls, and a third of a 505-token prefill of SmolLM2's 4-bit
file is outside the matrix products and attention: each int4 matrix dequantised in five operations,
the norms, RoPE, SiLU, residual adds and dtype conversions, each reading and writing its activations
(docs/benchmarks.md, "A prompt's pass compiled ahead of time"). Exported (``torch.export``, the
prompt's length and the cache's capacity as symbols) and compiled by AOTInductor, inductor fuses
each dequantisation and the elementwise work into a few kernels; attention and the products stay
the library's calls.

The package is made by ``gptlab compile`` after the one-row step (and by the background compile that
``--compile auto`` starts), kept in the same folder (``prompt.pt2`` and its record ``prompt.json``),
keyed and verified like the step (``gptlab.generate.one_token.StoredStep``, ``PROMPT``): it holds no
weights and reads the live model's tensors. It serves prompts of ``MIN_TOKENS`` or more up to the
model's context, from position 0 with no cached prefix, one sequence, a float cache; below
``MIN_TOKENS`` the int4 and int8 layers take their few-row kernels (``int4_dequant_rows``,
``int8_float_rows``) and a prompt's pass is short anyway. ``plan_decoding`` says whether it runs
(``DecodePlan.prompt``), and ``PreparedDecoding.prompts_ran()`` how many prompts it took.

Its arithmetic is not the eager pass's bit for bit: inductor computes a fused chain of bf16
operations in float32 and rounds once, where the eager pass rounds after each; logits agree to bf16
precision (tested), as the compiled one-row step's do with the layer-by-layer step's, so a greedy
text of a model with bf16 activations can differ between a process that runs the package and one
that does not (float32 models: to float32 rounding).
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from gptlab.generate.one_token import Kind, StoredStep, load_reading
from gptlab.generate.plan import Decoder, logits_of
from gptlab.model.kvcache import KVStore, KVView

#: the shortest prompt the kept pass takes (at or above every few-row kernel's threshold)
MIN_TOKENS = 128
#: the example prompt it is exported with (its length must differ from the cache's capacity, both symbols)
_EXAMPLE = MIN_TOKENS + 8


def prompt_pass(
    model: Decoder,
    idx: torch.Tensor,  # (1, T) the prompt
    pos: torch.Tensor,  # (T,) its positions, 0 … T − 1
    keys: list[torch.Tensor],  # per layer (1, H_kv, capacity ≥ T, d_k): written at [0, T)
    values: list[torch.Tensor],
) -> torch.Tensor:
    """The prompt's keys and values written at cache indices [0, T) → the last position's logits
    (1, vocab) float32 (causal attention over the prompt itself)."""
    t = idx.size(1)
    cache = [KVView(KVStore(k, v), write=0, end=t) for k, v in zip(keys, values, strict=True)]
    return logits_of(model.run(idx, pos=pos, cache=cache, last_only=True))[:, -1].float()


class _Prompt(nn.Module):
    """``prompt_pass`` as a module to export."""

    def __init__(self, model: Decoder) -> None:
        super().__init__()
        self.m = model

    def forward(
        self, idx: torch.Tensor, pos: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]
    ) -> torch.Tensor:
        return prompt_pass(self.m, idx, pos, keys, values)


def applies(model: Decoder) -> bool:
    """Whether a prompt pass is kept for ``model``: a decoder module whose context holds a prompt of
    ``MIN_TOKENS`` and more (the example it is exported with), in a weight format where it was measured
    to gain. SmolLM2's 505-token prefill, compiled against eager (``bench/kept_prefill.py``): int4 0.85–0.90
    (bf16 and float32 activations), int8 0.68 (bf16), float32 0.87–0.91; int8 weights with float32
    activations (below native bf16 a Q8_0 file's matrices are two int4 planes) 1.05, slower: not kept."""
    config = getattr(model, "config", None)
    slower = getattr(model, "quantization", "") == "int8" and model.dtype == torch.float32
    return (
        isinstance(model, nn.Module)
        and getattr(config, "arch", "decoder") != "encoder-decoder"
        and int(getattr(config, "block_size", 0)) > _EXAMPLE
        and not slower
    )


def _examples(model: Decoder, keys: list[torch.Tensor]) -> tuple[Any, ...] | None:
    if not applies(model):
        return None
    n_kv, d_k, dtype = keys[0].size(1), keys[0].size(3), keys[0].dtype
    return (
        torch.zeros(1, _EXAMPLE, dtype=torch.long),
        torch.arange(_EXAMPLE),
        [torch.zeros(1, n_kv, _EXAMPLE + 64, d_k, dtype=dtype) for _ in keys],
        [torch.zeros(1, n_kv, _EXAMPLE + 64, d_k, dtype=dtype) for _ in keys],
    )


def _shapes(model: Decoder, layers: int) -> dict[str, Any]:
    from torch.export import Dim

    t = Dim("t", min=MIN_TOKENS, max=int(model.config.block_size))
    capacity = Dim("capacity", min=MIN_TOKENS, max=1 << 24)
    return {
        "idx": {1: t},
        "pos": {0: t},
        "keys": [{2: capacity}] * layers,
        "values": [{2: capacity}] * layers,
    }


def _loaded(package: Path, model: Decoder, derived: dict[str, list[Any]]) -> Any:
    """The package as ``prompt_pass``'s signature, reading ``model``'s own tensors; a call outside what
    was exported (another model, a shorter or longer prompt, a cache too small) runs the eager pass."""
    loader, constants = load_reading(package, _Prompt(model), derived)
    longest = int(model.config.block_size)

    def run(
        m: Decoder, idx: torch.Tensor, pos: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor]
    ) -> torch.Tensor:
        t = idx.size(1)
        if m is not model or not MIN_TOKENS <= t <= longest or keys[0].size(2) < max(t, MIN_TOKENS):
            return prompt_pass(m, idx, pos, keys, values)
        out: torch.Tensor = loader.boxed_run([idx, pos, *keys, *values])[0]
        return out

    run.constants = constants  # type: ignore[attr-defined]  # kept alive: the loader reads them
    return run


#: a prompt's pass as a kept package (beside the one-row step, ``STEP``)
PROMPT = Kind("prompt", _Prompt, _examples, _shapes, _loaded)


class KeptPrompt:
    """The prompt pass of one model from the compile cache ``root``: loaded and verified at the first
    prompt it is given, then run for every prompt of ``MIN_TOKENS`` or more; the eager pass where the
    package is missing, damaged (a warning) or fails (a warning, then eager for good). ``kept_calls`` and
    ``eager_calls`` count the prompts each took."""

    def __init__(self, root: str | Path) -> None:
        self.store = StoredStep(Path(root), PROMPT)
        self._run: Any = None
        self._tried = False
        self.kept_calls = 0
        self.eager_calls = 0
        self.failure: Exception | None = None

    def __call__(
        self,
        model: Decoder,
        idx: torch.Tensor,
        pos: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
    ) -> torch.Tensor:
        if not self._tried:
            self._tried = True
            self._run = self.store.load((model, idx, pos, keys, values))
        if self._run is not None and idx.size(1) >= MIN_TOKENS:
            try:
                out: torch.Tensor = self._run(model, idx, pos, keys, values)
            except Exception as exc:  # a package that cannot run here: the eager pass, for good
                self._run, self.failure = None, exc
                warnings.warn(f"the kept prompt pass failed ({exc}); using the eager pass", stacklevel=2)
            else:
                self.kept_calls += 1
                return out
        self.eager_calls += 1
        return prompt_pass(model, idx, pos, keys, values)


def keep_prompt_pass(model: Decoder, root: str | Path, cache_dtype: torch.dtype) -> tuple[bool, str]:
    """Compile ``model``'s prompt pass into the compile cache ``root`` unless it is kept already →
    (whether it is kept now, what was done or why not): ``gptlab compile``'s second package."""
    store = StoredStep(Path(root), PROMPT)
    if not applies(model):
        return (
            False,
            f"no prompt pass for this model (a context under {_EXAMPLE + 1} tokens, or its weight format)",
        )
    config = model.config
    n_kv = config.n_kv_head or config.n_head
    keys = [torch.zeros(1, n_kv, 2, config.head_dim, dtype=cache_dtype) for _ in range(config.n_layer)]
    if store.kept(model, cache_dtype) and store.load((model, None, None, keys, keys)) is not None:
        return True, "kept already"  # (verified: a damaged or foreign one is compiled again, below)
    job = store.build((model, None, None, keys, keys))
    assert job is not None
    if job() is None:
        return False, store.skipped
    return True, "compiled"
