"""The static decode step on a CPU: weights frozen into the graph and packed once for inductor's GEMM.

A decode step of ``b`` rows multiplies a ``(b, K)`` block by every weight matrix, ``Y = X·Wᵀ``.
Called eagerly, MKL's ``sgemm`` re-packs W into its blocked layout on every call, and for a few
rows that packing and its threading cost more than the arithmetic: for a handful of rows the
weights stream far below the memory's rate (docs/benchmarks.md#decoding).

Compiled with inductor's ``freezing``, the weights become constants of the graph: inductor packs
each one once, at compile time, and ``max_autotune`` with its ``CPP`` GEMM back-end generates a
C++ micro-kernel per shape (``CppMicroGemmFP32Vec``: register blocks of rows × columns, W
streamed once for all ``b`` rows), several times faster for a few rows.
``b`` stays a symbol (the bucket), so one compilation serves every bucket, as on CUDA.

Freezing holds only for parameters that the compiled *module* owns, so the step runs through
``FrozenStep(model)``, whose forward passes its own ``model`` to the step; the session's cache and
row state stay ordinary inputs (they change every step). Frozen weights are copies of the
weights at compile time: ``FrozenStep.stale()`` notices a weight written in place since (its
version counter moved), and the model's ``DecodeEngine`` then compiles again rather than decode with old weights.
Cost: a compilation of minutes on a small CPU (the GEMM autotuning benchmarks each shape once;
inductor keeps the choices on disk) and one more copy of the matrices, packed.
"""

from __future__ import annotations

import torch
from torch import nn

from gptlab.compiling import Compiled
from gptlab.errors import GptlabError
from gptlab.generate.decoder import Decoder
from gptlab.generate.static_step import StaticRows, decode_bucket

#: inductor settings of the frozen step (``Compiled``'s ``patch``: held while it compiles)
FROZEN = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}


class FrozenStep(nn.Module):
    """``decode_bucket`` with ``model`` as this module's own child, so that freezing folds its weights."""

    def __init__(self, model: Decoder) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise GptlabError(f"the frozen step freezes a module's weights; got a {type(model).__name__}")
        self.model = model
        self._tensors = [t for t in model.state_dict(keep_vars=True).values() if t is not None]
        self.versions = self._versions()

    def _versions(self) -> int:
        return sum(t._version for t in self._tensors)

    def stale(self) -> bool:
        """True once a weight was written in place after this step was built (frozen copies are old)."""
        return self._versions() != self.versions

    def forward(
        self, session: StaticRows, bucket: torch.Tensor, flavour: str, horizon: torch.Tensor | None = None
    ) -> None:
        return decode_bucket(session, bucket, flavour, horizon, model=self.model)


def frozen_step(model: Decoder, flavour: str) -> Compiled:
    """The CPU static step of ``flavour`` for ``model``, weights frozen (compiled at its first call).

    Every session of the model may share it: the model's ``DecodeEngine`` keeps it, and builds
    another once ``stale(step)`` says a weight changed."""
    what = f"the static decode step ({flavour}, frozen weights)"
    return Compiled(FrozenStep(model), what, True, patch=FROZEN, distinct_sizes=True, fullgraph=True)


class FrozenSteps:
    """A model's frozen steps, one per sampler flavour, built at first use and again once stale.

    The model's ``DecodeEngine`` holds one, so that every static session of the model shares them."""

    def __init__(self, model: Decoder) -> None:
        self.model = model
        self.steps: dict[str, Compiled] = {}

    def get(self, flavour: str) -> Compiled:
        step = self.steps.get(flavour)
        if step is None or (isinstance(step.fn, FrozenStep) and step.fn.stale()):
            step = self.steps[flavour] = frozen_step(self.model, flavour)
        return step
