"""Options shared by every command that runs the model: ``--device``, and what ``--dtype auto`` means."""

from __future__ import annotations

import argparse

DEVICE_HELP = "auto (CUDA, else Apple's MPS, else the CPU), cpu, cuda, cuda:N or mps (default auto)"


def add_device_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def resolve_device(args: argparse.Namespace) -> str:
    """``args.device`` checked against this machine (one ``error:`` line for a bad one) → cpu, cuda:N or mps."""
    from gptlab.hardware import resolve_device as resolve

    return resolve(args.device, option="--device ")


def weights_format(dtype: str, device: str, checkpoint: str) -> str:
    """The weight format to run ``checkpoint`` in: an int8 checkpoint runs in int8 (``--dtype auto`` or
    ``int8``; another format is one ``error:`` line), a float one as ``resolve_dtype`` says."""
    from gptlab.checkpoint import stored_format
    from gptlab.errors import GptlabError

    stored = stored_format(checkpoint)
    if stored is None:
        return resolve_dtype(dtype, device)
    if dtype not in ("auto", stored):
        raise GptlabError(
            f"{checkpoint} holds {stored} weights; run it with --dtype {stored} (or auto), "
            f"or convert the float model again for --dtype {dtype}"
        )
    return stored


def resolve_dtype(dtype: str, device: str, bf16: str = "bf16", otherwise: str = "fp32") -> str:
    """``--dtype auto`` → ``bf16`` where bf16 is native on ``device``, else ``otherwise``.

    An explicit bf16 on a CPU that only emulates it is honoured, with one warning line.
    (``bf16``/``otherwise`` name the formats: ``bf16``/``fp32`` for weights, ``bfloat16``/``float32``
    for autocast.)
    """
    from gptlab.hardware import native_bf16, warn_if_emulated

    if dtype == "auto":
        return bf16 if native_bf16(device) else otherwise
    warn_if_emulated(device, dtype, f"--dtype {dtype}", "--dtype auto")
    return dtype
