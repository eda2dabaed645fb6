"""How to decode, decided in one place: ``plan_decoding(facts, settings, batch, …) → DecodePlan``.

A decode runs one of these engines (docs/design/decode-engines.md):

    session   dynamic (``BatchSession``: rows grow on demand)  |  static (``StaticSession``: fixed shapes)
    step      layers (module by module)  |  fused (one compiled graph, one row, CPU)
              frozen (the static step compiled with frozen weights, CPU)  |  cuda-graphs  |  compiled  |  eager
    sampler   per-request (``RequestState``'s ``Sampler``)  |  in-graph (``sampling``, the same functions on every row of the graph)

A request whose output a grammar constrains (``json_schema``, ``regex``, ``grammar``) takes the
per-request sampler, which applies the grammar's mask per row; the printed plan says so.

The plan is a pure function of what the model is (``ModelFacts``: device, compiler, matrix bytes,
weight format, activation dtype), what the caller asked (``DecodeSettings``: ``--compile``, whether a
static cache is allowed, the planned tokens) and the request (batch, sampling options, cache dtype,
probabilities wanted). Whether compiling pays is decided here too (``decode_compile_pays`` for the
one-row step and CUDA graphs, ``frozen_batches_pay`` for batches on a CPU); the figures behind the
thresholds are in docs/benchmarks.md#decoding. The one-row CPU step weighs no payback: it compiles
in the background while decoding goes on eagerly, and with ``compile_cache`` it is stored for later
processes (``gptlab.generate.one_token``), so it costs no wait; ``auto`` compiles it wherever it
gains (a compiler, matrices that stream from memory). The frozen batch step and CUDA graphs still
make the first step wait, so ``auto`` still weighs their payback. Library code reads no environment variable: the CLI
turns ``--static``/``GPTLAB_STATIC=0`` and ``--compile``/``GPTLAB_COMPILE=0`` into settings, and
``gptlab.compiling.configure(compile=False)`` is a fact the plan reads (``ModelFacts.compiler``), so
``prepare_decoding(model, compile="on")`` prints what then runs.

What the plan and every engine need of a model is ``Decoder``: a GPT, or an encoder–decoder bound to its source.

Every engine reads the same few things: the configuration (context, vocabulary, heads), whether
positions come from a table (the window past the context depends on it), the device and dtype, and
``run(idx, pos=…, cache=…, attn_mask=…, last_only=…)``, one forward pass over a ``LayeredCache``.
``GPT`` and ``EncoderDecoder.bind(source)`` both satisfy it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import nn

from gptlab.compiling import compile_blocker
from gptlab.errors import GptlabError
from gptlab.generate.config import SampleConfig
from gptlab.generate.sampling import supports
from gptlab.model.config import GPTConfig
from gptlab.model.gpt import ModelOutput
from gptlab.model.kvcache import LayeredCache
from gptlab.model.positional import PositionalEncoding
from gptlab.model.quantized import STREAM_MIN_BYTES, one_row_compiled

# From this many planned tokens a CPU generation waits for the one-row step's compilation when the
# compile cache does not hold it (a minute or more on 2 cores, then ~2× the tokens/s); below, auto
# decodes layer by layer at once and the step is compiled in the background for later processes.
PAYBACK_TOKENS = 8192
# On CUDA the static path's CUDA graphs: a compilation of tens of seconds, paid back only by a long generation.
CUDA_PAYBACK_TOKENS = 8192
# A frozen graph is not in inductor's on-disk graph cache, so each process compiles it again.
FROZEN_PAYBACK_TOKENS = 8192
COMPILE_CHOICES = ("auto", "on", "off")
NO_COMPILER = "no C++ compiler for torch.compile (install g++ or set CXX)"

#: what each step is, in words (the printed plan)
STEPS = {
    "layers": "layer by layer",
    "fused": "one compiled graph per token (one row)",
    "frozen": "compiled with frozen weights",
    "cuda-graphs": "CUDA graphs, one per batch bucket",
    "compiled": "compiled (the caller's torch.compile options)",
    "eager": "the static step run eagerly",
}
#: how a request is driven, in words (``DecodePlan.route``): the batched driver (``driver.decode_rows``),
#: beam search (its own dynamic session, one search step at a time), or an encoder–decoder's source
#: (bound alone, ``driver.bind_source``: one request at a time)
ROUTES = {"rows": "", "beam": "beam search", "source": "each source bound alone"}
#: how a prompt of one row is prefilled, in words (``DecodePlan.prompt``): eagerly, or from the
#: package the compile cache keeps (``gptlab.generate.prompt_pass``: prompts of 128 tokens or more)
PROMPTS = {"eager": "prompts eagerly", "kept": "prompts of 128+ tokens through the kept compiled pass"}
#: the steps that run through torch.compile (the rest run module by module or eagerly)
COMPILED_STEPS = frozenset({"fused", "frozen", "cuda-graphs", "compiled"})


@dataclass(frozen=True)
class DecodeSettings:
    """What the caller asked for; the plan reads nothing else from outside.

    ``compile``: ``auto``/``on``/``off`` (``--compile``), or None for the library's default (CUDA graphs
    on CUDA, layer by layer elsewhere). ``static``: None lets the plan choose; False never uses the
    static cache (``--static off``, ``GPTLAB_STATIC=0``); True uses it for every batch, on any device. ``planned_tokens``:
    tokens this process will generate (None: a long-lived session, chat or a server). ``lookahead``
    and ``compile_options`` are ``StaticSession``'s (a test's ``torch.compile`` back-end).
    ``compile_cache``: a directory where the compiled one-row step is kept for later processes
    (None: compiled in each process; the CLI's default is ``~/.cache/gptlab/compiled``).
    ``compile_wait`` (the default): the first decode step waits for the compiled one-row step (or
    loads it from ``compile_cache``). ``False`` compiles it in a background thread while the steps
    run eagerly; on a machine with few cores the compilation then takes the cores and the Python
    lock from those eager steps (measured many times slower, docs/benchmarks.md#decoding), so it
    is for machines with cores to spare.
    """

    compile: str | None = None
    static: bool | None = None
    planned_tokens: int | None = None
    lookahead: int | None = None
    compile_options: Mapping[str, object] | None = field(default=None, hash=False)
    compile_cache: str | None = None
    compile_wait: bool = True

    def __post_init__(self) -> None:
        if self.compile is not None and self.compile not in COMPILE_CHOICES:
            raise GptlabError(f"--compile must be one of {', '.join(COMPILE_CHOICES)}, got {self.compile!r}")


@dataclass(frozen=True)
class ModelFacts:
    """What the plan needs to know about a model (``ModelFacts.of(model)``; tests build one by hand)."""

    device: str  # "cpu", "cuda", "mps"
    compiler: bool  # torch.compile can build kernels for that device
    matrix_bytes: int  # what a decode step streams from memory
    weights: str = "fp32"  # "fp32" | "bf16" | "int8"
    activations: torch.dtype = torch.float32
    alibi_half: bool = False  # ALiBi in bf16/fp16: the static cache's bias would round the scores
    cpu: str = "AVX2"  # torch's CPU capability (AVX2, AVX512, DEFAULT): where the frozen batch step pays
    seq2seq: bool = False  # an encoder–decoder not yet bound to a source: each request binds its own
    no_compiler: str = NO_COMPILER  # why not, when ``compiler`` is False
    one_row: str = "library"  # a CPU's layer-by-layer one-row products: "library" | "compiled" (gemv)
    # the compile cache holds this model's compiled one-row step (None: no compile cache given)
    kept_step: bool | None = None
    # ... and its prompt pass (``gptlab.generate.prompt_pass``; None: no cache, or none applies)
    kept_prompt: bool | None = None

    @classmethod
    def of(cls, model: Decoder) -> ModelFacts:
        device = str(getattr(model, "device", torch.device("cpu"))).split(":")[0]
        dtype = getattr(model, "dtype", torch.float32)
        half = dtype in (torch.bfloat16, torch.float16)
        blocker = compile_blocker(device)
        return cls(
            device=device,
            compiler=blocker is None,
            no_compiler=blocker or NO_COMPILER,
            # (a bound encoder–decoder is not a module: nothing there to compile)
            matrix_bytes=matrix_bytes(model) if isinstance(model, nn.Module) else 0,
            weights=str(getattr(model, "quantization", "fp32")),
            activations=dtype,
            alibi_half=getattr(getattr(model, "config", None), "pos", None) == "alibi" and half,
            cpu=str(torch.backends.cpu.get_cpu_capability()) if device == "cpu" else "",
            seq2seq=isinstance(model, nn.Module)
            and getattr(getattr(model, "config", None), "arch", "decoder") == "encoder-decoder",
            one_row="compiled" if isinstance(model, nn.Module) and one_row_compiled(model) else "library",
        )


@dataclass(frozen=True)
class DecodePlan:
    """How a decode of ``batch`` sequences runs, and why; ``str(plan)`` is one line."""

    device: str
    batch: int
    session: str  # "dynamic" | "static"
    step: str  # a key of STEPS
    sampler: str  # "per-request" | "in-graph"
    why: str
    draft: str = "none"  # "none" | "prompt-lookup" (gptlab.generate.lookup)
    route: str = "rows"  # a key of ROUTES
    lone_rows: bool = False  # several rows, dynamic: a step that feeds one row alone runs the "fused" step
    prompt: str = "eager"  # a key of PROMPTS: how a prompt of one row is prefilled

    def __str__(self) -> str:
        drafts = ", prompt-lookup drafts" if self.draft == "prompt-lookup" else ""
        route = f", {ROUTES[self.route]}" if self.route != "rows" else ""
        lone = f" (a lone row: {STEPS['fused']})" if self.lone_rows else ""
        prompt = f", {PROMPTS[self.prompt]}" if self.prompt != "eager" else ""
        return (
            f"decode plan ({self.device}, batch {self.batch}): {self.session} cache, "
            f"{STEPS[self.step]}{lone}{prompt}, {self.sampler} sampler{drafts}{route} ({self.why})"
        )


def matrix_bytes(model: nn.Module) -> int:
    """Bytes of the model's 2-D weights in their stored format (what a decode step streams from memory).

    Parameters and buffers (quantized weights are buffers), tied tensors counted once, oneDNN's
    prepacked copies left out.
    """
    tensors = {**dict(model.named_parameters()), **dict(model.named_buffers())}
    seen: dict[int, int] = {}
    for name, t in tensors.items():
        if t is not None and t.dim() == 2 and not name.endswith("packed"):
            seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def decode_compile_pays(
    requested: str,
    device_type: str,
    compiler: bool,
    weight_bytes: int,
    planned_tokens: int | None,
    no_compiler: str = NO_COMPILER,
    kept: bool | None = None,
) -> tuple[bool, str]:
    """Whether to compile the decode step here, and why (a pure function of its inputs).

    ``on``/``off`` are obeyed (``on`` without a C++ compiler on a CPU, or with compiling switched
    off, runs layer by layer, with the reason ``no_compiler``). On a CPU ``auto`` never waits for a
    compilation it would not pay back: for a model whose matrices stream from memory (``weight_bytes
    ≥ STREAM_MIN_BYTES``; a smaller step gains nothing) it runs the compiled one-row step where the
    compile cache already ``kept`` it for this model and machine (loaded in milliseconds), compiles
    it for a generation of ``PAYBACK_TOKENS`` or more, and otherwise decodes layer by layer, while
    ``compiles_for_later`` says whether the caller should compile the step into the cache in the
    background for later processes (``gptlab compile``). On CUDA the question is whether
    to capture the static path's CUDA graphs: ``auto`` does for a long-lived session or from
    ``CUDA_PAYBACK_TOKENS`` planned tokens. Other devices run layer by layer.
    """
    if requested not in COMPILE_CHOICES:
        raise GptlabError(f"--compile must be one of {', '.join(COMPILE_CHOICES)}, got {requested!r}")
    if requested == "off":
        return False, "--compile off"
    if device_type == "cuda":
        if not compiler:
            return False, no_compiler
        if requested == "on" or planned_tokens is None:
            return True, "CUDA graphs of the static decode step" + (
                "" if requested == "on" else " (a long session)"
            )
        if planned_tokens < CUDA_PAYBACK_TOKENS:
            return False, (
                f"{planned_tokens} tokens do not pay back compiling CUDA graphs "
                f"(≈ 50 s on an H100; from {CUDA_PAYBACK_TOKENS})"
            )
        return True, "a long generation: CUDA graphs of the static decode step pay back their compilation"
    if device_type != "cpu":
        return False, f"the compiled CPU step does not apply on {device_type}"
    if not compiler:
        return False, no_compiler
    if requested == "on":
        return True, "--compile on"
    if weight_bytes < STREAM_MIN_BYTES:
        return False, f"a small model ({weight_bytes / 2**20:.0f} MiB of matrices): nothing to gain"
    if kept:
        return True, "its compiled step is kept for this model and machine"
    if planned_tokens is not None and planned_tokens >= PAYBACK_TOKENS:
        return True, f"a long generation ({planned_tokens} tokens) pays back waiting for the compilation"
    later = "; the compile cache does not hold it yet" if kept is False else " (--compile on compiles it)"
    return False, f"not compiled here, where the first token would wait a minute or more{later}"


def compiles_for_later(facts: ModelFacts, settings: DecodeSettings) -> bool:
    """Whether the caller should compile the one-row step (and the prompt pass) into the compile cache
    in the background (``gptlab compile``, a process of its own) for later processes: ``auto`` on a CPU
    with a compiler, a model large enough to gain, a cache that does not hold the step or its prompt
    pass yet, and a generation that does not compile the step here (``decode_compile_pays``)."""
    return (
        settings.compile == "auto"
        and not (settings.planned_tokens is not None and settings.planned_tokens >= PAYBACK_TOKENS)
        and facts.device == "cpu"
        and facts.compiler
        and facts.matrix_bytes >= STREAM_MIN_BYTES
        and (facts.kept_step is False or facts.kept_prompt is False)
    )


def frozen_batches_pay(
    requested: str,
    planned_tokens: int | None,
    weights: str,
    activations: torch.dtype = torch.float32,
    cpu: str = "AVX2",
) -> tuple[bool, str]:
    """Whether a CPU that compiles (already on for one sequence) also sends batches to the frozen step.

    For float matrices with float32 activations, what the frozen GEMM was measured with: fp32
    weights, and bf16 ones on a CPU that emulates bf16 (frozen, ``W.float()`` folds into a packed
    float32 constant). int8 weights and bf16 activations keep their own kernels. ``on`` then always;
    ``auto`` for a long-lived session or from ``FROZEN_PAYBACK_TOKENS`` planned tokens, on a CPU where
    it was measured to pay: 2.32× the layer-by-layer step at batch 8 on AVX2, but 1.27× on an AVX-512
    CPU (MKL's few-row sgemm is good there), short of the 1.3× an engine must show for a minute of
    compiling in every process (docs/benchmarks.md#decoding).
    """
    if weights not in ("fp32", "bf16") or activations != torch.float32:
        return False, f"batches decode layer by layer ({weights} weights keep their own kernels)"
    if requested != "on" and cpu.upper().startswith("AVX512"):
        return False, "batches decode layer by layer (on AVX-512 the frozen step gains 1.3x at most)"
    if requested == "on" or planned_tokens is None or planned_tokens >= FROZEN_PAYBACK_TOKENS:
        return True, "batches: the static step with frozen weights"
    return False, f"batches decode layer by layer (the frozen step pays from {FROZEN_PAYBACK_TOKENS} tokens)"


def _compile_default(facts: ModelFacts, settings: DecodeSettings) -> tuple[bool, str]:
    """No ``--compile`` given: the library's default for the device."""
    if facts.device == "cuda":
        if not facts.compiler:
            return False, facts.no_compiler
        return True, "CUDA graphs: the library's default on CUDA"
    return False, "not compiled (prepare_decoding(model, compile=...) or --compile asks)"


def _compile_asked(facts: ModelFacts, settings: DecodeSettings) -> tuple[bool, str]:
    assert settings.compile is not None
    return decode_compile_pays(
        settings.compile,
        facts.device,
        facts.compiler,
        facts.matrix_bytes,
        settings.planned_tokens,
        facts.no_compiler,
        facts.kept_step,
    )


def _static_on_cuda(
    facts: ModelFacts, settings: DecodeSettings, batch: int, compiled: bool
) -> tuple[bool, str]:
    return compiled, "CUDA graphs need the static cache" if compiled else "the dynamic cache, not compiled"


def _static_on_cpu(
    facts: ModelFacts, settings: DecodeSettings, batch: int, compiled: bool
) -> tuple[bool, str]:
    if not compiled or batch < 2:
        return False, "one sequence keeps the dynamic cache" if compiled else "the dynamic cache"
    requested = settings.compile or "on"
    return frozen_batches_pay(requested, settings.planned_tokens, facts.weights, facts.activations, facts.cpu)


def _static_elsewhere(
    facts: ModelFacts, settings: DecodeSettings, batch: int, compiled: bool
) -> tuple[bool, str]:
    return False, f"the dynamic cache on {facts.device}"


StaticRule = Callable[[ModelFacts, DecodeSettings, int, bool], tuple[bool, str]]
#: whether a device takes the static cache when the settings leave it to the plan
STATIC_BY_DEVICE: dict[str, StaticRule] = {"cuda": _static_on_cuda, "cpu": _static_on_cpu}


def static_blocker(
    facts: ModelFacts, config: SampleConfig | None, cache_dtype: torch.dtype | None, want_probs: bool
) -> str | None:
    """Why this request cannot take the static cache, or None."""
    if facts.alibi_half:
        return "ALiBi in half precision: over the static cache its bias would round the scores"
    if config is not None and config.constrained:
        return f"a {config.constraints()[0]} masks the tokens: the per-request sampler applies it"
    if config is not None and not supports(config):
        return "an option the in-graph sampler lacks (beam search, …)"
    if cache_dtype is not None and not cache_dtype.is_floating_point:
        return "an int8 cache dequantises on reads"
    if want_probs:
        return "per-token probabilities are wanted"
    return None


def _static_step(facts: ModelFacts, settings: DecodeSettings, compiled: bool) -> str:
    if not compiled:
        return "eager"
    if facts.device == "cuda":
        return "cuda-graphs"
    return "frozen" if settings.compile_options is None else "compiled"


#: how a layer-by-layer step on a CPU multiplies its one row (``gptlab.hardware.one_row_kernel``), in words
ONE_ROW = {
    "library": "one row through the library kernels",
    "compiled": "one row through the compiled one-row kernel",
}


def fused_how(settings: DecodeSettings, kept: bool | None = None) -> str:
    """How the one-row step comes to be: loaded, or compiled (waited for or in the background, stored or not)."""
    if kept:
        return f"loaded from {settings.compile_cache}"
    when = "the first step waits for it" if settings.compile_wait else "eager until it is ready"
    where = f"kept in {settings.compile_cache}" if settings.compile_cache else "compiled in this process"
    return f"{where}, {when}"


def plan_decoding(
    facts: ModelFacts,
    settings: DecodeSettings,
    batch: int,
    *,
    config: SampleConfig | None = None,
    cache_dtype: torch.dtype | None = None,
    want_probs: bool = False,
) -> DecodePlan:
    """The plan for a decode of ``batch`` sequences (``config`` etc.: the request, where known)."""
    route = route_of(config, facts.seq2seq)
    if route != "rows":  # one request at a time on the dynamic cache, layer by layer
        why = "beam search keeps its own dynamic session" if route == "beam" else "an encoder–decoder"
        return DecodePlan(facts.device, batch, "dynamic", "layers", "per-request", why, route=route)
    decide = _compile_default if settings.compile is None else _compile_asked
    # a kept one-row step decides for one row (batches: the frozen and CUDA steps weigh their own)
    compiled, why = decide(facts if batch == 1 else dataclasses.replace(facts, kept_step=None), settings)
    if settings.static is False:
        static, static_why = False, "static cache off (static=False: --static off)"
    elif settings.static:
        static, static_why = True, "static cache asked for"
    else:
        rule = STATIC_BY_DEVICE.get(facts.device, _static_elsewhere)
        static, static_why = rule(facts, settings, batch, compiled)
    blocker = static_blocker(facts, config, cache_dtype, want_probs) if static else None
    if static and blocker is None:
        step = _static_step(facts, settings, compiled)
        return DecodePlan(facts.device, batch, "static", step, "in-graph", f"{why}; {static_why}")
    float_cache = cache_dtype is None or cache_dtype.is_floating_point
    fused = compiled and facts.device == "cpu" and batch == 1 and float_cache
    reason = f"{why}; {blocker or static_why}"
    if config is not None and config.constrained and blocker is None:
        reason += f"; a {config.constraints()[0]} masks the tokens in the per-request sampler"
    if fused:
        reason += "; " + fused_how(settings, facts.kept_step)
    if compiled and facts.device == "cpu" and batch == 1 and not float_cache:
        reason += "; an int8 cache dequantises on reads: layer by layer"
    step = "fused" if fused else "layers"
    if step == "layers" and facts.device == "cpu" and batch == 1:
        reason += "; " + ONE_ROW[facts.one_row]
    # several rows: a step that feeds one of them alone runs the kept one-row step (nothing waits)
    lone = (
        batch > 1
        and bool(facts.kept_step)
        and facts.device == "cpu"
        and float_cache
        and decide(facts, settings)[0]
    )
    if lone:
        reason += f"; a step of one row: {STEPS['fused']}, {fused_how(settings, True)}"
    # a prompt of one row: the kept compiled pass wherever the kept step would run for one row
    prompt = bool(facts.kept_prompt) and facts.device == "cpu" and float_cache and decide(facts, settings)[0]
    if prompt:
        reason += f"; a prompt's pass loaded from {settings.compile_cache}"
    return DecodePlan(
        facts.device,
        batch,
        "dynamic",
        step,
        "per-request",
        reason,
        _draft(config, batch, step, facts.activations),
        lone_rows=lone,
        prompt="kept" if prompt else "eager",
    )


def route_of(config: SampleConfig | None, seq2seq: bool = False) -> str:
    """How a request is driven (``ROUTES``): an unbound encoder–decoder binds each source alone
    (``source``; its bound decoder is then planned like a GPT), ``beam_width`` > 1 is beam search
    (``beam``), anything else the batched rows of ``driver.decode_rows``."""
    if seq2seq:
        return "source"
    return "beam" if config is not None and config.beam_width > 1 else "rows"


def _draft(config: SampleConfig | None, batch: int, step: str, activations: torch.dtype) -> str:
    """Prompt lookup (``SampleConfig.prompt_lookup``) on the dynamic cache, for one sequence (a batch's
    rows would verify drafts of different lengths): ``on`` always; ``auto`` where the step runs layer
    by layer in float32, its drafting paused at run time where drafts keep failing (``lookup.Backoff``).
    A draft is verified in one wider pass: in bf16 activations its matrix products round otherwise
    than one row's, so a near-tie can resolve the other way and the text part from plain decoding's;
    beside the compiled one-row step (``fused``), several times faster a token, it pays only for long
    accepted drafts. ``auto`` leaves both out."""
    if config is None or batch != 1 or config.prompt_lookup == "off":
        return "none"
    if config.prompt_lookup == "auto" and (step != "layers" or activations != torch.float32):
        return "none"
    return "prompt-lookup"


# ------------------------------------------------------------ decoder
def logits_of(out: ModelOutput) -> torch.Tensor:
    """The logits of a forward pass (generation never asks for the chunked loss, which has none)."""
    if out.logits is None:
        raise GptlabError("the forward pass returned no logits (a chunked loss); generation needs them")
    return out.logits


class Decoder(Protocol):
    """A model that generation can decode (see the module docstring)."""

    config: GPTConfig
    positional: PositionalEncoding

    @property
    def device(self) -> torch.device: ...

    @property
    def dtype(self) -> torch.dtype: ...

    def run(
        self,
        idx: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        pos: torch.Tensor | None = None,
        cache: LayeredCache | None = None,
        attn_mask: torch.Tensor | None = None,
        last_only: bool = False,
    ) -> ModelOutput: ...
