"""The modeling code of a remote-code export, generated from gptlab's own ``gptlab.model`` source.

Hugging Face's ``trust_remote_code`` loads Python files that sit beside ``config.json``. They must
import nothing that is not installed (``transformers`` checks every non-relative import) and may
import each other only relatively and flatly (``from .x import y``; ``transformers`` copies a file
and, recursively, the files it imports that way into its module cache). So the export copies the
modules the model is made of, found by following imports from ``gptlab.model``, each to a flat file
``gptlab_<last name>.py``, and rewrites the lines that name ``gptlab``:

* ``from gptlab.model.norms import RMSNorm``  → ``from .gptlab_norms import RMSNorm``;
* ``from gptlab import configs``              → ``from . import gptlab_configs as configs``;
* the string ``"gptlab.model.mlp"`` (a module ``importlib`` opens by name) → ``__package__ + ".gptlab_mlp"``;
* an import inside a function of a module outside the copy (``GPT.generate`` opens ``gptlab.generate``)
  becomes ``raise ImportError(...)``: those paths need gptlab itself, and transformers' own
  ``generate`` replaces them.

Nothing else changes: the files are gptlab's source as it is, so the export computes what gptlab
computes, and a change to ``gptlab.model`` reaches the next export with no second copy to update.
"""

from __future__ import annotations

import ast
import importlib.util
from collections import deque
from dataclasses import dataclass
from pathlib import Path

ROOT_MODULE = "gptlab.model"
PACKAGE = "gptlab"
#: Imports inside functions are followed only into these packages (the model's own lazy imports).
LAZY_FOLLOWED = ("gptlab.model",)


def flat_name(module: str) -> str:
    """``gptlab.model.norms`` → ``gptlab_norms``; ``gptlab.model`` → ``gptlab_model``."""
    return f"{PACKAGE}_{module.rsplit('.', 1)[-1]}"


def _source_path(module: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise AssertionError(f"cannot find the source of {module}")  # a bug: the module imported fine
    return Path(spec.origin)


@dataclass(frozen=True)
class _Target:
    """One reference to a gptlab module in a source file."""

    module: str
    node: ast.stmt | ast.Constant
    lazy: bool  # inside a function


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _targets(tree: ast.Module) -> list[_Target]:
    """Every import of a gptlab module and every string that names one, with where it is."""
    out: list[_Target] = []
    lazy_nodes = {
        id(inner)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef)
        for inner in ast.walk(fn)
    }
    for node in ast.walk(tree):
        lazy = id(node) in lazy_nodes
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == PACKAGE:
                out.extend(_Target(f"{PACKAGE}.{a.name}", node, lazy) for a in node.names)
            elif node.module.startswith(PACKAGE + "."):
                out.append(_Target(node.module, node, lazy))
        elif isinstance(node, ast.Import):
            out.extend(_Target(a.name, node, lazy) for a in node.names if a.name.split(".")[0] == PACKAGE)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value.startswith(ROOT_MODULE) and _is_module(node.value):
                out.append(_Target(node.value, node, lazy))
    return out


def _followed(target: _Target) -> bool:
    return not target.lazy or target.module.startswith(LAZY_FOLLOWED)


def model_modules() -> dict[str, Path]:
    """The gptlab modules the model needs (``gptlab.model`` and what it imports), name → source file."""
    found: dict[str, Path] = {}
    queue = deque([ROOT_MODULE])
    while queue:
        module = queue.popleft()
        if module in found:
            continue
        found[module] = _source_path(module)
        tree = ast.parse(found[module].read_text(encoding="utf-8"))
        queue.extend(t.module for t in _targets(tree) if _followed(t))
    names = [flat_name(m) for m in found]
    if len(set(names)) != len(names):  # a bug in this module's naming, not bad input
        raise AssertionError(f"two gptlab modules share a flat file name: {sorted(names)}")
    return found


def _line_offsets(text: str) -> list[int]:
    offsets, total = [0], 0
    for line in text.splitlines(keepends=True):
        total += len(line)
        offsets.append(total)
    return offsets


def _replacement(target: _Target, copied: set[str], source: str) -> str:
    """The text that replaces ``target.node`` in the generated file."""
    node = target.node
    if isinstance(node, ast.Constant):
        return f'__package__ + ".{flat_name(target.module)}"'
    if target.module not in copied:
        if not target.lazy:  # a bug: every module-level import is followed into the copy
            raise AssertionError(f"{target.module} is imported at module level but not copied")
        return f'raise ImportError("{target.module} belongs to gptlab itself; this generated copy has the model only")'
    if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
        return "\n".join(
            f"from . import {flat_name(f'{PACKAGE}.{a.name}')} as {a.asname or a.name}" for a in node.names
        )
    if isinstance(node, ast.ImportFrom) and node.module is not None:
        text = ast.get_source_segment(source, node) or ""
        return text.replace(f"from {node.module} import", f"from .{flat_name(node.module)} import", 1)
    raise AssertionError(f"cannot rewrite `import {target.module}`; use `from ... import ...`")


def rewrite(source: str, copied: set[str]) -> str:
    """``source`` with every reference to a gptlab module made relative to the generated folder."""
    tree = ast.parse(source)
    offsets = _line_offsets(source)
    edits: dict[tuple[int, int], str] = {}
    for target in _targets(tree):
        node = target.node
        assert node.end_lineno is not None and node.end_col_offset is not None
        start = offsets[node.lineno - 1] + node.col_offset
        end = offsets[node.end_lineno - 1] + node.end_col_offset
        indent = " " * node.col_offset
        edits[(start, end)] = _replacement(target, copied, source).replace("\n", "\n" + indent)
    out = source
    for (start, end), text in sorted(edits.items(), reverse=True):
        out = out[:start] + text + out[end:]
    return out


def generated_files() -> dict[str, str]:
    """File name → text of the model's modules, rewritten for the export folder (each one compiles)."""
    modules = model_modules()
    copied = set(modules)
    files: dict[str, str] = {}
    for module, path in modules.items():
        text = rewrite(path.read_text(encoding="utf-8"), copied)
        header = (
            f"# Generated by gptlab from {module} ({path.name}); regenerate with `gptlab convert --to-hf`.\n"
        )
        files[f"{flat_name(module)}.py"] = header + text
        compile(files[f"{flat_name(module)}.py"], f"{flat_name(module)}.py", "exec")
        if _targets(ast.parse(text)):
            raise AssertionError(f"{module}: a reference to gptlab is left in the generated copy")
    return files


__all__ = ["ROOT_MODULE", "flat_name", "generated_files", "model_modules", "rewrite"]
