"""The report ``gptlab size`` prints: figures (a number, its formula, the formula with numbers in),
grouped by section, and the number formats the costs are for."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from gptlab.errors import GptlabError

# dtype name -> (torch dtype, bytes per number)
DTYPES: dict[str, tuple[torch.dtype, int]] = {
    "fp32": (torch.float32, 4),
    "fp16": (torch.float16, 2),
    "bf16": (torch.bfloat16, 2),
}
# KV-cache storage -> (torch dtype, bytes per number, bytes of scale per cached vector)
KV_DTYPES: dict[str, tuple[torch.dtype, int, int]] = {
    **{name: (dt, b, 0) for name, (dt, b) in DTYPES.items()},
    "int8": (torch.int8, 1, 4),  # k ≈ s·q: int8 numbers and one float32 scale per (row, head, position)
}
DTYPE_ALIASES = {"float32": "fp32", "float": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16"}


def dtype_name(name: str, table: dict[str, Any] = DTYPES, what: str = "dtype") -> str:
    """Canonical dtype name (``fp32``, ``fp16``, ``bf16``); aliases such as ``bfloat16`` accepted."""
    key = DTYPE_ALIASES.get(str(name).lower(), str(name).lower())
    if key not in table:
        raise GptlabError(f"unknown {what} {name!r}; choose one of {', '.join(table)}")
    return key


@dataclass
class Figure:
    """One number, the formula it comes from, and the formula with the numbers put in."""

    name: str
    value: int | float
    unit: str  # "params", "FLOPs", "bytes"
    formula: str
    calc: str = ""
    note: str = ""


@dataclass
class SizeReport:
    """Parameters, FLOPs, KV cache and training memory of one configuration."""

    config: dict[str, Any]
    symbols: dict[str, int | str]
    parameters: list[Figure] = field(default_factory=list)
    compute: list[Figure] = field(default_factory=list)
    kv_cache: list[Figure] = field(default_factory=list)
    training_memory: list[Figure] = field(default_factory=list)
    title: str = ""

    def figure(self, name: str) -> Figure:
        for section in (self.parameters, self.compute, self.kv_cache, self.training_memory):
            for fig in section:
                if fig.name == name:
                    return fig
        raise KeyError(name)

    def value(self, name: str) -> int | float:
        return self.figure(name).value

    def to_dict(self) -> dict[str, Any]:
        sections = ("parameters", "compute", "kv_cache", "training_memory")
        return {
            "title": self.title,
            "config": self.config,
            "symbols": self.symbols,
            **{s: [asdict(f) for f in getattr(self, s)] for s in sections},
        }

    def render(self) -> str:
        lines = [self.title, "  " + "  ".join(f"{k}={v}" for k, v in self.symbols.items()), ""]
        headings = (
            ("Parameters", self.parameters),
            ("Compute per token", self.compute),
            ("KV cache (generation)", self.kv_cache),
            ("Training memory (AdamW)", self.training_memory),
        )
        for heading, figs in headings:
            lines.append(heading)
            for f in figs:
                calc = f" = {f.calc}" if f.calc else ""
                lines.append(f"  {f.name:<24}{_human(f.value, f.unit):>15}   {f.formula}{calc}")
                if f.note:
                    lines.append(f"  {'':<24}{'':>15}     {f.note}")
            lines.append("")
        return "\n".join(lines).rstrip() + "\n"


def _human(value: float, unit: str) -> str:
    """``124,439,808`` params, ``1.2 GFLOPs``, ``474.7 MiB``."""
    if unit == "params":
        return f"{int(value):,}"
    if unit == "bytes":
        for scale, suffix in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if value >= scale:
                return f"{value / scale:.1f} {suffix}"
        return f"{int(value)} B"
    for power, prefix in ((1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= power:
            return f"{value / power:.2f} {prefix}{unit}"
    return f"{value:g} {unit}"
