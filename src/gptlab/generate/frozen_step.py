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
version counter moved), and the session then compiles again rather than decode with old weights.
Cost: a compilation of minutes on a small CPU (the GEMM autotuning benchmarks each shape once;
inductor keeps the choices on disk) and one more copy of the matrices, packed.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import torch
from torch import nn

from gptlab.compiling import Compiled
from gptlab.generate.static_step import decode_step

if TYPE_CHECKING:
    from gptlab.generate.static import StaticSession

#: inductor settings of the frozen step (``Compiled``'s ``patch``: held while it compiles)
FROZEN = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}
# A frozen graph is not in inductor's on-disk graph cache, so each process compiles it again; the
# time that costs is paid back from about this many tokens, or in a long-lived process
# (docs/benchmarks.md#decoding).
FROZEN_PAYBACK_TOKENS = 8192


def frozen_batches_pay(
    requested: str, planned_tokens: int | None, weights: str, activations: torch.dtype = torch.float32
) -> tuple[bool, str]:
    """Whether ``--compile`` (already on for one sequence) also sends batches to the frozen step.

    For float matrices with float32 activations, what the frozen GEMM was measured with: fp32
    weights, and bf16 ones on a CPU that emulates bf16 (frozen, ``W.float()`` folds into a packed
    float32 constant, as fast as fp32's: docs/benchmarks.md#decoding). int8 weights and bf16
    activations keep their own kernels. ``on`` then always; ``auto`` for a long-lived session
    (``planned_tokens`` None: the server, chat) or from ``FROZEN_PAYBACK_TOKENS`` planned tokens.
    """
    if weights not in ("fp32", "bf16") or activations != torch.float32:
        return False, f"batches decode layer by layer ({weights} weights keep their own kernels)"
    if requested == "on" or planned_tokens is None or planned_tokens >= FROZEN_PAYBACK_TOKENS:
        return True, "batches: the static step with frozen weights"
    return False, f"batches decode layer by layer (the frozen step pays from {FROZEN_PAYBACK_TOKENS} tokens)"


class FrozenStep(nn.Module):
    """``decode_step`` with ``model`` as this module's own child, so that freezing folds its weights."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._tensors = [t for t in model.state_dict(keep_vars=True).values() if t is not None]
        self.versions = self._versions()

    def _versions(self) -> int:
        return sum(t._version for t in self._tensors)

    def stale(self) -> bool:
        """True once a weight was written in place after this step was built (frozen copies are old)."""
        return self._versions() != self.versions

    def forward(
        self, session: StaticSession, bucket: torch.Tensor, flavour: str, horizon: torch.Tensor | None = None
    ) -> None:
        return decode_step(session, bucket, flavour, horizon, model=self.model)


_STEPS: weakref.WeakKeyDictionary[nn.Module, dict[str, Compiled]] = weakref.WeakKeyDictionary()


def frozen_step(model: nn.Module, flavour: str) -> Compiled:
    """The compiled CPU step of ``flavour`` for ``model``, shared by all its sessions (compiled at its
    first call; again if a weight changed since)."""
    steps = _STEPS.setdefault(model, {})
    step = steps.get(flavour)
    if step is None or step.fn.stale():
        what = f"the static decode step ({flavour}, frozen weights)"
        step = steps[flavour] = Compiled(
            FrozenStep(model), what, True, patch=FROZEN, distinct_sizes=True, fullgraph=True
        )
    return step
