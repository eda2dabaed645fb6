"""Options shared by every command that runs the model: ``--device``, and what ``--dtype auto`` means."""

from __future__ import annotations

import argparse

DEVICE_HELP = "auto (CUDA, else Apple's MPS, else the CPU), cpu, cuda, cuda:N or mps (default auto)"


WEIGHT_FORMATS = ("auto", "fp32", "bf16", "int8")


def add_weights_argument(p: argparse.ArgumentParser) -> None:
    """``--dtype``: the weight format of a command that generates (sample, chat, serve)."""
    p.add_argument(
        "--dtype",
        choices=WEIGHT_FORMATS,
        default="auto",
        help="weight format (default auto: bf16 where bf16 is native; on a CPU that emulates bf16, bf16 "
        "matrices with float32 activations for one sequence, fp32 for several; an int8 checkpoint stays int8)",
    )


def add_device_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def resolve_device(args: argparse.Namespace) -> str:
    """``args.device`` checked against this machine (one ``error:`` line for a bad one) → cpu, cuda:N or mps."""
    from gptlab.hardware import resolve_device as resolve

    return resolve(args.device, option="--device ")


def weights_format(dtype: str, device: str, checkpoint: str, sequences: int = 1) -> str:
    """The weight format to run ``checkpoint`` in: an int8 checkpoint runs in int8 (``--dtype auto`` or
    ``int8``; another format is one ``error:`` line), a float one as given or, for ``auto``, as
    ``gptlab.hardware.inference_weights`` says for ``sequences`` decoded together."""
    from gptlab.checkpoint import stored_format
    from gptlab.errors import GptlabError
    from gptlab.hardware import inference_weights

    stored = stored_format(checkpoint)
    if stored is None:
        return inference_weights(device, sequences) if dtype == "auto" else resolve_dtype(dtype, device)
    if dtype not in ("auto", stored):
        raise GptlabError(
            f"{checkpoint} holds {stored} weights; run it with --dtype {stored} (or auto), "
            f"or convert the float model again for --dtype {dtype}"
        )
    return stored


def resolve_dtype(dtype: str, device: str, bf16: str = "bf16", otherwise: str = "fp32") -> str:
    """``--dtype auto`` → ``bf16`` where bf16 is native on ``device``, else ``otherwise``.

    (``bf16``/``otherwise`` name the formats: ``bf16``/``fp32`` for weights, ``bfloat16``/``float32``
    for autocast.) An explicit bf16 is honoured; as an autocast dtype on a CPU that only emulates
    it, with one warning line. bf16 *weights* there compute in float32 (``gptlab.quantize``), so
    nothing is emulated and nothing is said.
    """
    from gptlab.hardware import native_bf16, warn_if_emulated

    if dtype == "auto":
        return bf16 if native_bf16(device) else otherwise
    if bf16 == "bfloat16":
        warn_if_emulated(device, dtype, f"--dtype {dtype}", "--dtype auto")
    return dtype


def add_compile_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="auto",
        help="run each decode step as one compiled graph. CPU: one sequence through the one-row "
        "kernels; several (and the server) through a static cache with the weights frozen into the "
        "graph. CUDA: CUDA graphs. auto (default): on with a compiler, for a large model and a "
        "generation long enough to pay back the compilation (seconds to two minutes)",
    )


def apply_compile(
    requested: str, model: object, device: str, planned_tokens: int | None, not_for: str | None = None
) -> bool:
    """Decide ``--compile`` for this model and machine (``decode_compile_pays``); compile if it pays.

    What was chosen, and why, goes to stderr as one ``compile:`` line on a CPU, so the choice is
    never silent. ``not_for`` names a decode that the one-sequence step does not serve (beam
    search, an encoder–decoder): it then stays layer by layer.
    """
    import sys

    from gptlab.compiling import can_compile
    from gptlab.generate import compile_decode
    from gptlab.generate.fused_step import decode_compile_pays, matrix_bytes

    device_type = device.split(":")[0]
    if not_for is not None:
        if requested == "on":
            sys.stderr.write(f"compile: off (the compiled step decodes one sequence, not {not_for})\n")
        return False
    on, why = decode_compile_pays(
        requested, device_type, can_compile(device_type), matrix_bytes(model), planned_tokens
    )
    from gptlab.generate.static_decode import static_decode

    if device_type == "cuda":  # the static path, with or without its CUDA graphs
        static_decode(model, enabled=on)
    elif on:
        from gptlab.generate.frozen_step import frozen_batches_pay

        compile_decode(model)  # one sequence: the one-row kernels in one graph
        weights, activations = getattr(model, "quantization", "fp32"), getattr(model, "dtype", None)
        batches, more = frozen_batches_pay(requested, planned_tokens, weights, activations)
        if batches:  # two sequences or more (and the server): the static step, weights frozen
            static_decode(model, compile=True, min_batch=2)
        why = f"{why}; {more}"
    if requested != "off" and device_type in ("cpu", "cuda"):
        sys.stderr.write(f"compile: {'on' if on else 'off'} ({why})\n")
    return on
