"""A package's names imported on first use (PEP 562), so that importing the package costs nothing.

``gptlab`` and ``gptlab.interop`` give ``lazy_names`` a table ``{name: (module, attribute)}`` and take
the ``__getattr__`` and ``__dir__`` it returns: ``gptlab.load`` imports ``gptlab.sources`` when first
read, and ``import gptlab.interop.gguf_file`` runs no exporter.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_names(
    package: str, names: dict[str, tuple[str, str]], namespace: dict[str, Any]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` whose ``names`` live elsewhere: a name is imported when
    first read and kept in ``namespace`` (the package's globals), so later reads cost nothing."""

    def getattr_(name: str) -> Any:
        if name in names:
            module, attr = names[name]
            value = getattr(importlib.import_module(module), attr)
            namespace[name] = value
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def dir_() -> list[str]:
        return sorted(list(namespace) + list(names))

    return getattr_, dir_
