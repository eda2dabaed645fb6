"""Request bodies of the HTTP API, as pydantic models (OpenAI's field names and defaults).

Validation is strict (``"5"`` is not an int, ``true`` is not a number), as in OpenAI's
API; a bad value becomes a 400 with the OpenAI error object naming the field. Fields
the API does not know are ignored, so clients that send extra OpenAI options work.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# The limits of a request body (also reported by GET /v1/gptlab/limits).
MAX_N = 16  # choices per prompt
MAX_LOGPROBS = 5  # completions: logprobs
MAX_TOP_LOGPROBS = 20  # chat: top_logprobs
MAX_TOP_N = 20  # the playground's alternatives per token
MAX_ATTENTION_TOKENS = 512
MAX_INSIDE_TOKENS = 128  # the Inside view (serve/inside_routes.py) keeps every layer's T×T weights


class SamplingFields(BaseModel):
    """The sampling options shared by every generating endpoint.

    OpenAI's: ``max_tokens``, ``temperature``, ``top_p``, ``n``, ``stop``, ``seed``,
    ``frequency_penalty``, ``presence_penalty``. gptlab's extras: ``top_k``, ``min_p``,
    ``repetition_penalty``, ``beam_width``, ``length_penalty``, ``early_stopping``.
    ``logit_bias`` maps token ids (as strings, like OpenAI) to a bias in [-100, 100].
    """

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=0)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: str | list[str] | None = None
    seed: int | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0)
    beam_width: int = Field(default=1, ge=1, le=16)
    length_penalty: float = 1.0
    early_stopping: bool = True
    user: str | None = None
    logit_bias: dict[str, float] | None = None

    def stop_list(self) -> list[str]:
        """``stop`` as a list (OpenAI allows a string, a list of up to 4, or null)."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def include_usage(self) -> bool:
        return bool((self.stream_options or {}).get("include_usage", False))


class CompletionRequest(SamplingFields):
    """``POST /v1/completions``: ``prompt`` is a string, a list of strings, or token ids."""

    prompt: str | list[str] | list[int] | list[list[int]] = ""
    echo: bool = False
    logprobs: int | None = Field(default=None, ge=0, le=MAX_LOGPROBS)


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def text(self) -> str:
        """The message's text; a list of content parts keeps the ``{"type": "text"}`` ones."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(str(p.get("text", "")) for p in self.content if p.get("type") == "text")


class ChatCompletionRequest(SamplingFields):
    """``POST /v1/chat/completions``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=0)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=MAX_TOP_LOGPROBS)


class GenerateRequest(SamplingFields):
    """``POST /v1/gptlab/generate``: one prompt, streamed token by token with probabilities."""

    prompt: str = ""
    top_n: int = Field(default=5, ge=0, le=MAX_TOP_N)


class AttentionRequest(BaseModel):
    """``POST /v1/gptlab/attention``: the attention weights of one layer for ``text``."""

    model_config = ConfigDict(strict=True, extra="ignore")

    model: str | None = None
    text: str = Field(min_length=1)
    layer: int = -1
    max_tokens: int = Field(default=128, ge=1, le=MAX_ATTENTION_TOKENS)  # keep the last this many tokens
