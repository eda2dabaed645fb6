"""Options shared by every command that runs the model: the model itself (any source), ``--device``, and
what ``--dtype auto`` means."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gptlab.cli.background import Later
    from gptlab.compiling import Toolchain
    from gptlab.generate import PreparedDecoding, SampleConfig
    from gptlab.generate.plan import Decoder

#: plan steps that are compiled (the ``compile: on`` line)

DEVICE_HELP = "auto (CUDA, else Apple's MPS, else the CPU), cpu, cuda, cuda:N or mps (default auto)"


WEIGHT_FORMATS = ("auto", "fp32", "bf16", "int8", "int4")

#: what every command that takes a model accepts (``gptlab.sources``)
MODEL_HELP = (
    "a gptlab checkpoint or run directory, a Hugging Face folder, a GGUF file, "
    "or smollm2 (the packaged SmolLM2-135M-Instruct GGUF file)"
)


def add_model_argument(p: argparse.ArgumentParser) -> None:
    """The positional ``MODEL`` of every command that runs one: any source ``gptlab.sources`` opens."""
    p.add_argument("checkpoint", metavar="MODEL", help=MODEL_HELP)


def add_weights_argument(p: argparse.ArgumentParser) -> None:
    """``--dtype``: the weight format of a command that generates (sample, chat, serve)."""
    p.add_argument(
        "--dtype",
        choices=WEIGHT_FORMATS,
        default="auto",
        help="weight format (default auto: bf16 where bf16 is native; on a CPU that emulates bf16, bf16 "
        "matrices with float32 activations for one sequence, fp32 for several; an int8 or int4 checkpoint stays "
        "so; a GGUF file keeps its weights: Q4_0/Q4_1 int4, other quantized types int8)",
    )


def add_device_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", default="auto", help=DEVICE_HELP)


def device_from_args(args: argparse.Namespace) -> str:
    """``args.device`` checked against this machine (one ``error:`` line for a bad one) → cpu, cuda:N or mps."""
    from gptlab.hardware import resolve_device as resolve

    return resolve(args.device, option="--device ")


def weights_format(
    dtype: str, device: str, checkpoint: str, sequences: int = 1, store: str | None = None
) -> str:
    """The weight format to run the model ``checkpoint`` names in: an int8 checkpoint runs in int8
    (``--dtype auto`` or ``int8``; another format is one ``error:`` line), a float one (or a Hugging
    Face folder, a GGUF file) as given or, for ``auto``, as ``gptlab.hardware.inference_weights`` says
    for ``sequences`` decoded together; a GGUF file with quantized matrices runs as it ships (``keep``:
    known without reading its header where ``store``, the ``--weights-cache``, already keeps its
    conversion). A source that names no model is ``gptlab.sources``' one line."""
    from gptlab.errors import GptlabError
    from gptlab.hardware import inference_weights
    from gptlab.sources import source_path, stored_format

    gguf = source_path(checkpoint)
    if gguf.is_file() and gguf.suffix.lower() == ".gguf":  # quantized weights as llama.cpp runs them
        if dtype == "auto" and device.split(":")[0] == "cpu" and _quantized_gguf(gguf, store):
            return "keep"
        return inference_weights(device, sequences) if dtype == "auto" else resolve_dtype(dtype, device)
    stored = stored_format(checkpoint)
    if stored is None:
        return inference_weights(device, sequences) if dtype == "auto" else resolve_dtype(dtype, device)
    if dtype not in ("auto", stored):
        raise GptlabError(
            f"{checkpoint} holds {stored} weights; run it with --dtype {stored} (or auto), "
            f"or convert the float model again for --dtype {dtype}"
        )
    return stored


def _quantized_gguf(path: Path, store: str | None) -> bool:
    """Whether a GGUF file holds quantized matrices (Q4_0, Q8_0, …) rather than only float ones: yes
    where ``store`` keeps its ``keep`` conversion (only an int4 or int8 one is kept), else its header says."""
    from gptlab.checkpoint import kept

    if store is not None and kept.has_entry(path, "keep", store):
        return True
    from gguf import GGMLQuantizationType

    from gptlab.interop.gguf import read_gguf

    floats = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}
    return any(t.tensor_type not in floats for t in read_gguf(path).tensors)


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


def compile_settings(env: Mapping[str, str] = os.environ) -> Toolchain:
    """The process-wide compile settings from the environment (``gptlab.compiling.configure``'s
    arguments): ``GPTLAB_COMPILE=0`` switches every compiled kernel off, ``$CXX`` names the C++
    compiler. The only place they are read; ``main`` sets them for the command and restores them."""
    from gptlab.compiling import Toolchain

    return Toolchain(compile=env.get("GPTLAB_COMPILE", "1") != "0", cxx=env.get("CXX") or None)


def add_cache_arguments(p: argparse.ArgumentParser, env: Mapping[str, str] = os.environ) -> None:
    """``--compile-cache`` and ``--weights-cache``: what a command that loads a model keeps per machine."""
    p.add_argument(
        "--compile-cache",
        default=default_compile_cache(env),
        metavar="DIR",
        help="where the compiled decode step is kept, so that a later process loads it instead of "
        "compiling (default $XDG_CACHE_HOME/gptlab/compiled, else ~/.cache/gptlab/compiled; "
        "'none': compile in each process)",
    )
    p.add_argument(
        "--weights-cache",
        default=default_cache("weights", env),
        metavar="DIR",
        help="where a GGUF file's weights, once converted into int4/int8 layers, and a float32 "
        "checkpoint's bf16 copy (where it runs in bf16) are kept, so that a later start reads them "
        "instead of converting (default $XDG_CACHE_HOME/gptlab/weights, else ~/.cache/gptlab/weights; "
        "'none': convert at every start)",
    )


def add_compile_argument(p: argparse.ArgumentParser, env: Mapping[str, str] = os.environ) -> None:
    """``--compile`` (default ``off`` under ``GPTLAB_COMPILE=0``), ``--static`` (default ``off`` under
    ``GPTLAB_STATIC=0``), ``--background-compile`` and the caches: the decode settings of sample, chat
    and serve."""
    p.add_argument(
        "--compile",
        choices=["auto", "on", "off"],
        default="off" if env.get("GPTLAB_COMPILE", "1") == "0" else "auto",
        help="run each decode step as one compiled graph. CPU: one sequence through the one-row "
        "kernels; several (and the server) through a static cache with the weights frozen into the "
        "graph. CUDA: CUDA graphs. auto (default), on a CPU with a compiler and a large model: the "
        "one-row step if the compile cache holds it (else layer by layer, and it is compiled for later "
        "processes in the background: --background-compile); compiled here for a generation of 8,192 "
        "tokens or more. GPTLAB_COMPILE=0 makes off the default and switches every compiled kernel off",
    )
    add_cache_arguments(p, env)
    p.add_argument(
        "--background-compile",
        choices=["auto", "off"],
        default="off" if env.get("GPTLAB_BACKGROUND_COMPILE", "1") == "0" else "auto",
        help="auto (default): under --compile auto, where the compile cache lacks the one-row step, "
        "compile it for later processes in a background process at the lowest CPU priority (gptlab "
        "compile); this process decodes layer by layer. off: never (GPTLAB_BACKGROUND_COMPILE=0 makes "
        "off the default)",
    )
    p.add_argument(
        "--static",
        choices=list(STATIC_CHOICES),
        default="off" if env.get("GPTLAB_STATIC", "1") == "0" else "auto",
        help="decode through the static (fixed-shape) cache: auto (default) where the plan picks it "
        "(CUDA graphs, batches of a CPU that compiles), on for every batch, off never "
        "(GPTLAB_STATIC=0 makes off the default)",
    )


def default_compile_cache(env: Mapping[str, str] = os.environ) -> str:
    """``--compile-cache``'s default: ``$XDG_CACHE_HOME/gptlab/compiled``, else ``~/.cache/gptlab/compiled``."""
    return default_cache("compiled", env)


def default_cache(name: str, env: Mapping[str, str] = os.environ) -> str:
    """``$XDG_CACHE_HOME/gptlab/NAME``, else ``~/.cache/gptlab/NAME``: what gptlab keeps per machine."""
    base = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "gptlab", name)


def cache_dir(value: str | None) -> str | None:
    """A cache option's folder, or None for ``none`` (or nothing given)."""
    return None if value in (None, "", "none") else value


#: ``--static`` → ``prepare_decoding``'s ``static``
STATIC_CHOICES: dict[str, bool | None] = {"auto": None, "on": True, "off": False}


def prepare_decode(
    requested: str,
    model: Decoder,
    planned_tokens: int | None,
    not_for: str | None = None,
    static: str = "auto",
    compile_cache: str | None = None,
    later: Later | None = None,
) -> PreparedDecoding:
    """``--compile``, ``--static`` and ``--compile-cache`` (``none``/None: none) →
    ``prepare_decoding(model, …)`` → its engine.

    What ``--compile`` chose, and why, goes to stderr as one ``compile:`` line on a CPU or CUDA, so
    the choice is never silent (``print_plan`` shows the whole plan). ``not_for`` names a decode that
    the compiled steps do not serve (beam search, an encoder–decoder): it then stays layer by layer.
    ``--static off`` keeps every decode off the static cache. ``later`` (``--background-compile
    auto``): where the plan says so (``compiles_for_later``), the one-row step is compiled into the
    compile cache by a background ``gptlab compile`` for later processes (``gptlab.cli.compile``).
    """
    from gptlab.generate import prepare_decoding
    from gptlab.generate.plan import COMPILED_STEPS, compiles_for_later

    if requested == "on" and not_for is not None:
        sys.stderr.write(f"compile: off (the compiled step decodes one sequence, not {not_for})\n")
    asked = "off" if not_for is not None else requested
    store = cache_dir(compile_cache)
    engine = prepare_decoding(
        model,
        compile=asked,
        static=STATIC_CHOICES[static],
        planned_tokens=planned_tokens,
        compile_cache=store,
    )
    one, batches = engine.plan(1), engine.plan(2)
    on = one.step in COMPILED_STEPS
    why = batches.why if one.device == "cpu" and on and asked == "on" else one.why
    if later is not None and not_for is None:
        if compiles_for_later(engine.facts(), engine.settings):
            from gptlab.cli.background import compile_later

            why += "; " + compile_later(engine, later)
    if requested != "off" and not_for is None and one.device in ("cpu", "cuda"):
        sys.stderr.write(f"compile: {'on' if on else 'off'} ({why})\n")
    return engine


def print_plan(engine: PreparedDecoding, batch: int, config: SampleConfig | None = None) -> None:
    """The decode plan for ``batch`` sequences, on one line of stderr (``--verbose``, the server's start)."""
    sys.stderr.write(f"{engine.plan(batch, config=config)}\n")


def add_structure_arguments(p: argparse.ArgumentParser, grammars: bool = True) -> None:
    """``--json-schema FILE|SCHEMA`` (and, with ``grammars``, ``--regex PATTERN`` and ``--grammar FILE``):
    the output follows a JSON schema, a regex or a Lark grammar (``SampleConfig``'s structured output)."""
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--json-schema",
        metavar="FILE|SCHEMA",
        help="the output is JSON valid against this JSON Schema: a file, or the schema itself, "
        "as llama.cpp's --json-schema takes it (text starting with '{'; '{}': any JSON)",
    )
    if grammars:
        group.add_argument("--regex", metavar="PATTERN", help="the output matches this regular expression")
        group.add_argument(
            "--grammar",
            metavar="FILE",
            help="the output is a string of the Lark grammar in FILE (start: ...)",
        )


def structure_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """The ``SampleConfig`` fields that ``add_structure_arguments``' options set (files read here)."""
    import json
    from pathlib import Path

    from gptlab.errors import GptlabError

    def read(option: str, name: str) -> str:
        path = Path(name)
        if not path.is_file():
            raise GptlabError(f"{option} {name}: file not found")
        try:
            return path.read_text(encoding="utf-8")
        except UnicodeDecodeError as exc:
            raise GptlabError(
                f"{option} {name}: not UTF-8 text (invalid byte at offset {exc.start})"
            ) from None

    out: dict[str, Any] = {}
    if getattr(args, "json_schema", None):
        given: str = args.json_schema
        inline = given.lstrip().startswith("{")  # the schema itself (a JSON Schema is an object)
        try:
            out["json_schema"] = json.loads(given if inline else read("--json-schema", given))
        except json.JSONDecodeError as exc:
            shown = "" if inline else f" {given}"
            raise GptlabError(f"--json-schema{shown}: not JSON ({exc})") from None
    if getattr(args, "regex", None):
        out["regex"] = args.regex
    if getattr(args, "grammar", None):
        out["grammar"] = read("--grammar", args.grammar)
    return out
