"""Chat templates: a conversation → the one prompt string the model was trained to continue.

A template is Jinja text, usually the model's own (GGUF ``tokenizer.chat_template``, Hugging Face
``tokenizer_config.json``), rendered as transformers' ``apply_chat_template`` does: a sandboxed,
immutable environment (``jinja2.sandbox.ImmutableSandboxedEnvironment``, ``trim_blocks``,
``lstrip_blocks``, loop controls), with ``messages``, ``add_generation_prompt``, the special tokens
(``bos_token``, ``eos_token`` …), ``raise_exception``, ``strftime_now`` and a ``tojson`` filter that
keeps non-ASCII text. Models without one use a named fallback:

* ``chatml``: ``<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n``;
* ``llama3``: ``<|start_header_id|>user<|end_header_id|>\\n\\nHi<|eot_id|>`` …;
* ``plain``: gptlab's role-tagged lines, ``user: Hi\\nassistant:`` (stops at the next ``\\nuser:``).

A reply ends at the tokenizer's end-of-turn ids (``<|im_end|>``, ``<|eot_id|>``, eos), or at the
fallback's stop strings.

    >>> t = ChatTemplate.named("chatml")
    >>> t.render([{"role": "user", "content": "Hi"}])
    '<|im_start|>user\\nHi<|im_end|>\\n<|im_start|>assistant\\n'
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

from gptlab.errors import GptlabError

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

FALLBACKS: dict[str, str] = {
    "chatml": (
        "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
        "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    ),
    "llama3": (
        "{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}<|end_header_id|>"
        "\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
        "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    ),
    "plain": (
        "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant:{% endif %}"
    ),
}

#: Stop strings of a fallback whose turns end with no special token.
FALLBACK_STOPS: dict[str, list[str]] = {"plain": ["\nuser:", "\nsystem:", "\nassistant:"]}

#: A special token in the vocabulary → the fallback that uses it (first match wins).
FALLBACK_BY_TOKEN = {"<|im_start|>": "chatml", "<|start_header_id|>": "llama3"}

#: Special-token names passed to a template, as transformers does.
TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token")


def _raise(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def compile_template(source: str) -> Any:
    """The compiled Jinja template (sandboxed); a syntax error is a ``GptlabError``."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise GptlabError(
            f"the chat template is not valid Jinja (line {exc.lineno}: {exc.message})"
        ) from None


def _messages(messages: Sequence[Any]) -> list[dict[str, Any]]:
    """Messages as ``{"role", "content"}`` dicts (objects with ``role``/``content`` attributes accepted)."""
    out = []
    for i, m in enumerate(messages):
        d = (
            dict(m)
            if isinstance(m, Mapping)
            else {"role": getattr(m, "role", None), "content": getattr(m, "content", None)}
        )
        if not isinstance(d.get("role"), str) or not isinstance(d.get("content"), str):
            raise GptlabError(f"message {i} must have a string 'role' and a string 'content', got {m!r}")
        out.append(d)
    return out


@dataclass
class ChatTemplate:
    """A chat template (``source``, Jinja) with the special tokens it may name and its stop strings."""

    source: str
    name: str = "model"
    tokens: dict[str, str] = field(default_factory=dict)
    stop_strings: list[str] = field(default_factory=list)

    @classmethod
    def named(cls, name: str, tokens: Mapping[str, str | None] | None = None) -> ChatTemplate:
        if name not in FALLBACKS:
            raise GptlabError(f"unknown chat template {name!r}; the named ones are {', '.join(FALLBACKS)}")
        return cls(
            FALLBACKS[name],
            name,
            {k: v for k, v in (tokens or {}).items() if v},
            FALLBACK_STOPS.get(name, []),
        )

    def render(self, messages: Sequence[Any], add_generation_prompt: bool = True, **extra: Any) -> str:
        """The prompt for ``messages``; with ``add_generation_prompt`` it ends where the assistant's reply starts."""
        import jinja2

        msgs = _messages(messages)
        if not msgs:
            raise GptlabError("a chat needs at least one message")
        context = {"bos_token": "", "eos_token": "", **self.tokens, **extra}
        try:
            return compile_template(self.source).render(
                messages=msgs, add_generation_prompt=add_generation_prompt, **context
            )
        except jinja2.TemplateError as exc:  # raise_exception(...) in the template, or a sandbox refusal
            raise GptlabError(f"the {self.name} chat template refused these messages: {exc}") from None


def template_for(tokenizer: Tokenizer, override: str | None = None) -> ChatTemplate:
    """The chat template of ``tokenizer``: ``override`` (a fallback's name or Jinja text), else its own
    (``tokenizer.chat_template``), else the fallback its special tokens imply (``chatml``, ``llama3``), else ``plain``.
    """
    tokens = {name: getattr(tokenizer, name, None) for name in TOKEN_NAMES}
    source = override if override is not None else getattr(tokenizer, "chat_template", None)
    if source is not None and source not in FALLBACKS:
        return ChatTemplate(
            source, "model" if override is None else "given", {k: v for k, v in tokens.items() if v}
        )
    if source is None:
        specials = getattr(tokenizer, "special_tokens", {}) or {}
        source = next((name for tok, name in FALLBACK_BY_TOKEN.items() if tok in specials), "plain")
    return ChatTemplate.named(source, tokens)


def stop_ids(tokenizer: Tokenizer) -> list[int]:
    """Token ids that end a reply: the tokenizer's end-of-turn and end-of-sequence ids."""
    from gptlab.tokenizers.pretrained import END_OF_TURN

    ids = getattr(tokenizer, "stop_ids", None)
    if ids is not None:
        return list(ids)
    specials = getattr(tokenizer, "special_tokens", {}) or {}
    eot = getattr(tokenizer, "eot_id", None)
    return sorted({*(specials[t] for t in END_OF_TURN if t in specials), *([eot] if eot is not None else [])})


def encode_chat(
    tokenizer: Tokenizer, messages: Sequence[Any], template: ChatTemplate | None = None
) -> list[int]:
    """Render ``messages`` with the template and encode the prompt (the template's special tokens are matched)."""
    template = template or template_for(tokenizer)
    ids = list(tokenizer.encode(template.render(messages), allowed_special="all"))
    # encode() put the source's BOS first (add_bos); a chat template writes its own, and transformers'
    # apply_chat_template adds none
    return (
        ids[1:]
        if getattr(tokenizer, "add_bos", False) and getattr(tokenizer, "bos_id", None) is not None
        else ids
    )


__all__ = ["FALLBACKS", "ChatTemplate", "compile_template", "encode_chat", "stop_ids", "template_for"]
