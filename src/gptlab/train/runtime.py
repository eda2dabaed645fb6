"""What a training process sets up around the loop: CPU threads, autocast, ``torch.compile``,
RNG states for checkpoints, and Ctrl-C / SIGTERM as a request to save and stop."""

from __future__ import annotations

import contextlib
import os
import signal
import warnings
from typing import Any

import torch

from gptlab.compiling import can_compile
from gptlab.errors import GptlabError
from gptlab.train.config import TrainConfig

AUTOCAST_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
#: inductor's settings for a training step compiled for a CPU (``compile_forward``)
CPU_TRAINING_OPTIONS: dict[str, Any] = {"cpp_wrapper": True}


def autocast(device_type: str, dtype: str) -> contextlib.AbstractContextManager[Any]:
    if dtype == "float32":
        return contextlib.nullcontext()
    if dtype == "float16" and device_type != "cuda":
        raise GptlabError(
            "dtype=float16 needs a CUDA device (it uses a gradient scaler); use dtype=bfloat16 on CPU"
        )
    return torch.autocast(device_type=device_type, dtype=AUTOCAST_DTYPES[dtype])


def compile_forward(forward: Any, device_type: str) -> Any:
    """``torch.compile`` the training forward (the model, or its DDP wrapper), or return it unchanged.

    The whole model is one graph: the forward and backward each run as a handful of fused
    kernels around the matrix products (docs/benchmarks.md#precision; compiling block by block
    halves the cold compile but runs slower).
    The graph runs from the token ids to the scalar loss: the head and the cross-entropy
    (plain, or ``loss_impl = "chunked"``, whose autograd.Function dynamo traces in, unbroken)
    are inside it, and AOTAutograd compiles the matching backward. Outside it: the gradient
    norm and clipping (foreach kernels) and the optimizer step (one fused AdamW kernel on CUDA).
    Checkpoints save the uncompiled model, so parameter names do not change. On a CPU,
    inductor needs a C++ compiler; without one the run warns and trains uncompiled. There the
    graphs' kernels are called from C++ (``cpp_wrapper``), not from a Python wrapper: a small
    model's step is mostly short kernels, and calling them from Python cost ~6 % of it
    (docs/benchmarks.md#training).
    """
    if not can_compile(device_type):
        warnings.warn(
            "compile=true needs a C++ compiler on CPU (none found: install g++ or set CXX); "
            "training uncompiled",
            stacklevel=2,
        )
        return forward
    return torch.compile(forward, options=CPU_TRAINING_OPTIONS if device_type == "cpu" else None)


def compile_caches() -> contextlib.AbstractContextManager[Any]:
    """Around a compiled training forward: AOTAutograd's on-disk cache may keep a graph that holds
    one of our ``torch.autograd.Function``s (``_CompiledGELU``, ``ChunkedHeadLoss``).

    AOTAutograd keeps each traced forward–backward pair on disk, so that a later process skips
    tracing the joint graph and partitioning it (~3 s of a run's first step on a 2-core CPU,
    docs/benchmarks.md#training). By default it refuses any graph with a custom autograd.Function
    in it. Dynamo traces such a Function's forward and backward into subgraphs of the graph itself,
    and the cache key hashes the graph, subgraphs included. Changing either half is then a new key.
    PyTorch puts this behind a flag while it tests it more widely.
    """
    import torch._functorch.config

    return torch._functorch.config.patch(autograd_cache_allow_custom_autograd_functions=True)  # type: ignore[attr-defined,no-any-return]


def rng_state(device_type: str) -> dict[str, torch.Tensor]:
    state = {"torch": torch.get_rng_state()}
    if device_type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, torch.Tensor], device_type: str) -> None:
    torch.set_rng_state(state["torch"])
    if device_type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"])


def threads(cfg: TrainConfig, world: int) -> int:
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:
        cores = os.cpu_count() or 1
    return cfg.threads or max(1, cores // world)


class StopFlag:
    """Ctrl-C (SIGINT) or SIGTERM asks the loop to save and stop after the current step; a second Ctrl-C aborts."""

    def __init__(self) -> None:
        self.requested = False
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopFlag:
        with contextlib.suppress(ValueError):  # not the main thread: no handlers
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True

    def __exit__(self, *exc: Any) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
