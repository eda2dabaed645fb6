"""``lm_eval --model gptlab``: registers the model name ``gptlab`` in lm-evaluation-harness, lazily.

gptlab installs ``gptlab_lmeval_hook.pth`` into site-packages (``setup.py``: by a wheel and by
``pip install -e``). Python runs its one line at start-up, which calls ``install()`` here.

Why a start-up hook. lm-eval 0.4.13 reads no plugin entry points for models. ``lm_eval.api.registry.get_model``
imports ``lm_eval.models`` while the model registry is empty (that module registers lm-eval's own models as
lazy ``"module:object"`` strings, its ``MODEL_MAPPING``) and then looks the name up, so a model outside
lm-eval exists for the ``lm_eval`` command only if something registers it before that lookup.

What it does. ``install()`` puts one finder at the front of ``sys.meta_path``. The finder finds nothing itself:
when ``lm_eval.models`` is imported it asks the other finders for the module and wraps its loader, so that
right after ``lm_eval.models`` has run, ``"gptlab"`` is registered as the string
``"gptlab.evaluate.harness:GptlabLM"`` (unless the name is taken already, e.g. by
``import gptlab.evaluate.harness``). Registering after ``lm_eval.models`` keeps lm-eval's own models: the
registry is still empty at ``get_model``'s check. Nothing is imported at start-up: not lm-eval, not gptlab,
not torch; gptlab and torch load when lm-eval materialises the string, i.e. when a run asks for ``gptlab``.

This module imports nothing from gptlab (importing ``gptlab`` imports torch), and a failure here never
breaks lm-eval: the name is then left unregistered and a warning says why.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

NAME = "gptlab"
TARGET = "gptlab.evaluate.harness:GptlabLM"
WATCHED = "lm_eval.models"


def register() -> None:
    """Register ``NAME`` → ``TARGET`` in lm-eval's model registry, unless the name is taken."""
    try:
        registry = sys.modules["lm_eval.api.registry"].model_registry
        if NAME not in registry:
            registry.register(NAME, target=TARGET)
    except Exception as exc:  # a later lm-eval with another registry: leave lm-eval working
        import warnings

        warnings.warn(f"gptlab could not register the lm-eval model {NAME!r}: {exc!r}", stacklevel=2)


class _Loader:
    """The real loader of ``lm_eval.models``, then ``register()``; every other attribute is the real one's."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)
        register()

    def __getattr__(self, name: str) -> Any:  # get_source, get_code, is_package … (inspect, pkgutil)
        return getattr(self._loader, name)


class Finder:
    """A ``sys.meta_path`` finder that only wraps the loader of ``lm_eval.models`` (found by the others)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != WATCHED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def install() -> None:
    """Put the finder first in ``sys.meta_path`` (once); if ``lm_eval.models`` is already imported, register now."""
    if not any(isinstance(f, Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, Finder())
    if WATCHED in sys.modules:
        register()
