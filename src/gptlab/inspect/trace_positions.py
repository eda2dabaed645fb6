"""The position stage of ``gptlab trace``: what each positional encoding contributes, by name.

learned     h⁽⁰⁾_i = e_i + W_p[i]
sinusoidal  h⁽⁰⁾_i = e_i + PE_i
rope        q, k rotated by pos·θ_i inside attention
alibi       score_ij += −m_h·(i − j) inside attention
none        h⁽⁰⁾_i = e_i
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from gptlab.model import GPT
from gptlab.model.positional import alibi_slopes

N_VALUES = 4  # how many numbers of a vector to show


def _added_table(
    table: Any, name: str, where: str, formula: str, T: int, labels: list[str]
) -> dict[str, Any]:
    """A position table added to the token embeddings: its first ``T`` rows, as the trace shows them."""
    return {
        "where": where,
        "formula": formula,
        "shape": [T, table.size(1)],
        "table": name,
        "table_shape": list(table.shape),
        "rows": first_values(table[:T], labels),
    }


def _learned(model: GPT, T: int, labels: list[str]) -> dict[str, Any]:
    table = model.positional.wpe.weight  # type: ignore[union-attr]
    return _added_table(
        table, "W_p", "added to the token embeddings", "h⁽⁰⁾_i = e_i + p_i,  p_i = W_p[i]", T, labels
    )


def _sinusoidal(model: GPT, T: int, labels: list[str]) -> dict[str, Any]:
    return _added_table(
        model.positional.table,  # type: ignore[union-attr]
        "PE",
        "added to the token embeddings (a fixed table, not learned)",
        "h⁽⁰⁾_i = e_i + PE_i,  PE[i, 2j] = sin(i/10000^(2j/d)),  PE[i, 2j+1] = cos(i/10000^(2j/d))",
        T,
        labels,
    )


def _rope_angles(model: GPT, T: int, labels: list[str]) -> dict[str, Any]:
    c = model.config
    d = c.head_dim
    theta = [c.rope_theta ** (-2 * i / d) for i in range(d // 2)]
    return {
        "where": "inside every attention layer: q and k are rotated; nothing is added to h⁽⁰⁾",
        "formula": f"rotate feature pairs of q, k by angle pos·θ_i, θ_i = {c.rope_theta:g}^(−2i/d_k), d_k = {d}",
        "values": {
            "theta_first": round_list(theta[:N_VALUES]),
            "theta_last": round_list(theta[-1:]),
            f"angles_at_pos_{T - 1}": round_list([(T - 1) * t for t in theta[:N_VALUES]]),
        },
    }


def _alibi(model: GPT, T: int, labels: list[str]) -> dict[str, Any]:
    slopes = alibi_slopes(model.config.n_head).tolist()
    return {
        "where": "inside every attention layer: a distance penalty on the scores; nothing is added to h⁽⁰⁾",
        "formula": "score_ij += −m_h·(i − j),  m_h = 2^(−8h/H)",
        "values": {"slopes": round_list(slopes)},
    }


def _none(model: GPT, T: int, labels: list[str]) -> dict[str, Any]:
    return {"where": "nowhere: only the causal mask tells positions apart", "formula": "h⁽⁰⁾_i = e_i"}


POSITION_STAGES: dict[str, Callable[[GPT, int, list[str]], dict[str, Any]]] = {
    "learned": _learned,
    "sinusoidal": _sinusoidal,
    "rope": _rope_angles,
    "alibi": _alibi,
    "none": _none,
}


def round_list(values: Sequence[float], digits: int = 4) -> list[float]:
    return [round(float(v), digits) for v in values]


def first_values(matrix: torch.Tensor, labels: list[str]) -> list[dict[str, Any]]:
    """First ``N_VALUES`` numbers of each row of a ``(T, d)`` matrix."""
    return [
        {"position": i, "token": labels[i], "values": round_list(row[:N_VALUES].tolist())}
        for i, row in enumerate(matrix.float())
    ]
