"""``SampleConfig``: every decoding option in one validated dataclass (blueprint §12, "Decoding Strategies")."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from gptlab import configs
from gptlab.errors import GptlabError

PROMPT_LOOKUP = ("auto", "on", "off")


@dataclass
class SampleConfig:
    """How to turn next-token logits into text.

    ``temperature=0`` is greedy (``argmax_i p_i``); otherwise ``p_i ∝ exp(logit_i/τ)``,
    truncated by top-k, top-p (nucleus) and min-p. ``beam_width > 1`` runs beam
    search instead of sampling. ``logit_bias`` adds ``b_i`` to the logit of token ``i``
    before the temperature (OpenAI's ``logit_bias``: −100 bans a token, +100 forces it).
    Generation stops at ``max_new_tokens``, at a stop token (``stop_tokens`` plus the
    tokenizer's ``<|endoftext|>``) or a stop string; neither is emitted. Past the model's
    context, ``slide=True`` goes on over a window of the last ``block_size`` tokens;
    ``slide=False`` stops there with ``finish_reason="context"``. ``prompt_lookup`` drafts tokens
    from the text so far and verifies them in one forward pass: it never changes the output, only
    how many passes it takes (``gptlab.generate.lookup``; the decode plan says when it runs).

    Structured output (``generate/grammar.py``): at most one of ``json_schema`` (a JSON Schema;
    ``{"type": "object"}`` is any JSON object), ``regex`` and ``grammar`` (a Lark grammar, which may
    inline JSON schemas with ``%json{...}``) restricts every step to the tokens that keep the text a
    prefix of that language, and allows a stop token only where the text is complete; a reply that
    is complete ends with ``finish_reason="stop"``. Not with beam search.
    """

    max_new_tokens: int = 256
    temperature: float = 1.0  # 0 = greedy
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    beam_width: int = 1
    length_penalty: float = 1.0
    early_stopping: bool = True
    stop: list[str] = field(default_factory=list)  # stop strings, never emitted
    stop_tokens: list[int] = field(default_factory=list)  # plus the tokenizer's <|endoftext|>
    seed: int | None = None
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added to its logit
    slide: bool = True  # past the context: a sliding window (True) or stop with "context" (False)
    json_schema: dict[str, Any] | None = None  # the reply is JSON valid against this schema
    regex: str | None = None  # the reply matches this regular expression
    grammar: str | None = None  # the reply is a string of this Lark grammar
    # drafts from the text so far, verified in one pass (gptlab.generate.lookup): same output, fewer passes
    prompt_lookup: str = "auto"  # "auto" (one sequence on the dynamic cache), "on", "off"

    def __post_init__(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = list(self.stop)
        self.stop_tokens = list(self.stop_tokens)
        if isinstance(self.logit_bias, dict):  # JSON object keys are strings: "50256" -> 50256
            self.logit_bias = {
                int(k) if isinstance(k, str) and k.isdigit() else k: v for k, v in self.logit_bias.items()
            }
        self.validate()

    def validate(self) -> None:
        """Raise ``GptlabError`` naming the option to change."""

        def need(ok: bool, msg: str) -> None:
            if not ok:
                raise GptlabError(f"invalid sampling option: {msg}")

        def is_int(x: Any) -> bool:
            return isinstance(x, int) and not isinstance(x, bool)

        def is_num(x: Any) -> bool:
            return (
                isinstance(x, int | float) and not isinstance(x, bool) and x == x and abs(x) != float("inf")
            )

        need(
            is_int(self.max_new_tokens) and self.max_new_tokens >= 0,
            f"max_new_tokens must be a non-negative integer, got {self.max_new_tokens!r}",
        )
        need(
            is_num(self.temperature) and self.temperature >= 0,
            f"temperature must be a number ≥ 0 (0 = greedy), got {self.temperature!r}",
        )
        need(
            self.top_k is None or (is_int(self.top_k) and self.top_k >= 1),
            f"top_k must be a positive integer or null, got {self.top_k!r}",
        )
        need(
            self.top_p is None or (is_num(self.top_p) and 0 <= self.top_p <= 1),
            f"top_p must be in [0, 1] or null, got {self.top_p!r}",
        )
        need(
            self.min_p is None or (is_num(self.min_p) and 0 <= self.min_p <= 1),
            f"min_p must be in [0, 1] or null, got {self.min_p!r}",
        )
        need(
            is_num(self.repetition_penalty) and self.repetition_penalty > 0,
            f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty!r}",
        )
        need(
            is_num(self.frequency_penalty),
            f"frequency_penalty must be a number, got {self.frequency_penalty!r}",
        )
        need(
            is_num(self.presence_penalty), f"presence_penalty must be a number, got {self.presence_penalty!r}"
        )
        need(
            is_int(self.beam_width) and self.beam_width >= 1,
            f"beam_width must be a positive integer (1 = no beam search), got {self.beam_width!r}",
        )
        need(is_num(self.length_penalty), f"length_penalty must be a number, got {self.length_penalty!r}")
        need(
            isinstance(self.early_stopping, bool),
            f"early_stopping must be true or false, got {self.early_stopping!r}",
        )
        need(
            all(isinstance(s, str) and s for s in self.stop),
            f"stop must be a list of non-empty strings, got {self.stop!r}",
        )
        need(
            all(is_int(t) and t >= 0 for t in self.stop_tokens),
            f"stop_tokens must be a list of token ids (non-negative integers), got {self.stop_tokens!r}",
        )
        need(self.seed is None or is_int(self.seed), f"seed must be an integer or null, got {self.seed!r}")
        need(
            isinstance(self.logit_bias, dict)
            and all(
                is_int(k) and k >= 0 and is_num(v) and -100 <= v <= 100 for k, v in self.logit_bias.items()
            ),
            f"logit_bias must map token ids (non-negative integers) to numbers in [-100, 100], "
            f"got {self.logit_bias!r}",
        )
        need(isinstance(self.slide, bool), f"slide must be true or false, got {self.slide!r}")
        need(
            self.json_schema is None or isinstance(self.json_schema, dict),
            f"json_schema must be a JSON object (a JSON Schema) or null, got {type(self.json_schema).__name__}",
        )
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            need(
                value is None or (isinstance(value, str) and value != ""),
                f"{name} must be a non-empty string or null, got {value!r}",
            )
        constraints = self.constraints()
        need(
            len(constraints) <= 1,
            f"give at most one of json_schema, regex and grammar, got {', '.join(constraints)}",
        )
        need(
            not (constraints and self.beam_width > 1),
            f"beam search (beam_width={self.beam_width}) does not take a {constraints[0] if constraints else ''}; "
            "set beam_width=1 to sample under it",
        )
        need(
            self.prompt_lookup in PROMPT_LOOKUP,
            f"prompt_lookup must be one of {', '.join(PROMPT_LOOKUP)}, got {self.prompt_lookup!r}",
        )
        if self.beam_width > 1:
            truncation = [n for n in ("top_k", "top_p", "min_p") if getattr(self, n) is not None]
            need(
                not truncation,
                f"beam search (beam_width={self.beam_width}) is deterministic and does not use "
                f"{', '.join(truncation)}; drop them or set beam_width=1 to sample",
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def constraints(self) -> list[str]:
        """The structured-output options that are set (``json_schema``, ``regex``, ``grammar``)."""
        return [n for n in ("json_schema", "regex", "grammar") if getattr(self, n) is not None]

    @property
    def constrained(self) -> bool:
        """A grammar restricts the tokens (a json_schema, a regex or a Lark grammar is set)."""
        return bool(self.constraints())

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SampleConfig:
        return configs.from_dict(cls, data, "sampling option")

    def replace(self, **changes: Any) -> SampleConfig:
        """A copy with some options changed (and re-validated)."""
        return SampleConfig.from_dict({**self.to_dict(), **changes})
