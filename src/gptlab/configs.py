"""One way to read a config dataclass from a dict: unknown keys are an error that lists the valid ones.

``GPTConfig``, ``SampleConfig`` and ``TrainConfig`` all round-trip through JSON/TOML with it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

from gptlab.errors import GptlabError

T = TypeVar("T")


def check_keys(data: Any, cls: type, what: str, hint: str = "") -> None:
    """Raise ``GptlabError`` unless ``data`` is a dict whose keys are all fields of ``cls``."""
    if not isinstance(data, dict):
        raise GptlabError(f"{what} must be a table of settings (a JSON object), got {type(data).__name__}")
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise GptlabError(f"unknown {what} key(s) {', '.join(unknown)}; valid keys: {', '.join(known)}{hint}")


def from_dict(cls: type[T], data: Any, what: str, hint: str = "") -> T:
    """``cls(**data)`` after ``check_keys``; a wrong type is a ``GptlabError`` too."""
    check_keys(data, cls, what, hint)
    try:
        return cls(**data)
    except TypeError as exc:
        raise GptlabError(f"invalid {what}: {exc}") from None
