"""Heatmaps of attention weights, labelled with tokens (matplotlib, Agg; no window is opened).

Three layouts of an ``(L, H, T, T)`` tensor from ``attention_maps``:

* ``plot_head``: one head of one layer, query tokens down, key tokens across;
* ``plot_layer``: a grid of every head of one layer;
* ``plot_overview``: a layers × heads grid of small maps.

Future positions (``j > i``, masked by ``M``) are drawn blank; ``causal=False`` (an
encoder's maps, or cross-attention maps ``(L, H, T_target, S_source)`` with their own
column labels ``col_labels``) draws every cell. Each function writes the image
atomically and returns its size in pixels, ``(width, height)``.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write
from gptlab.inspect.inputs import plot_label

DPI = 100
FORMATS = ("png", "svg", "pdf")
MAX_LABELLED_TOKENS = 64  # longer inputs get no tick labels
MAX_FIGURE_INCHES = 40.0


def _check_index(name: str, value: int, count: int) -> None:
    if not 0 <= value < count:
        raise GptlabError(f"{name} {value} does not exist: the model has {count} {name}s (0..{count - 1})")


def image_format(path: str | os.PathLike[str]) -> str:
    suffix = Path(path).suffix.lower().lstrip(".") or "png"
    if suffix not in FORMATS:
        raise GptlabError(
            f"{path}: cannot write a .{suffix} image; use one of {', '.join('.' + f for f in FORMATS)}"
        )
    return suffix


def _masked(weights: torch.Tensor, causal: bool = True) -> np.ma.MaskedArray:
    """A ``(T, T_k)`` map with the causally masked future (``j > i``) blanked when ``causal``."""
    a = weights.detach().float().cpu().numpy()
    return np.ma.masked_array(a, mask=np.triu(np.ones(a.shape, dtype=bool), k=1) & causal)


def _draw(  # noqa: ANN202
    ax,  # noqa: ANN001
    weights: torch.Tensor,
    labels: Sequence[str] | None,
    vmax: float,
    fontsize: float,
    col_labels: Sequence[str] | None = None,
    causal: bool = True,
):
    from matplotlib import colormaps

    cmap = colormaps["viridis"].with_extremes(bad="white")
    image = ax.imshow(_masked(weights, causal), cmap=cmap, vmin=0.0, vmax=vmax, interpolation="nearest")
    T, T_k = weights.shape[-2:]
    cols = labels if col_labels is None else col_labels
    if labels is not None and cols is not None and max(T, T_k) <= MAX_LABELLED_TOKENS:
        ax.set_xticks(range(T_k), labels=[plot_label(s) for s in cols], rotation=90, fontsize=fontsize)
        ax.set_yticks(range(T), labels=[plot_label(s) for s in labels], fontsize=fontsize)
    else:
        ax.set_xticks([])
        ax.set_yticks([])
    return image


def _save(fig, path: str | os.PathLike[str]) -> tuple[int, int]:  # noqa: ANN001
    fmt = image_format(path)
    parent = Path(path).parent
    if not parent.is_dir():
        raise GptlabError(f"{path}: the folder {parent} does not exist")
    atomic_write(path, lambda tmp: fig.savefig(tmp, format=fmt, dpi=DPI))
    w, h = fig.get_size_inches()
    return round(w * DPI), round(h * DPI)


def _figure(width: float, height: float):  # noqa: ANN202
    from matplotlib.figure import Figure

    scale = min(1.0, MAX_FIGURE_INCHES / max(width, height))
    return Figure(figsize=(width * scale, height * scale), dpi=DPI)


def _label_size(T: int) -> float:
    return max(5.0, min(10.0, 200.0 / max(T, 1)))


def _rc():  # noqa: ANN202
    """Tokens are shown literally: no mathtext for ``$`` in a token."""
    import matplotlib

    return matplotlib.rc_context({"text.parse_math": False})


def plot_head(
    maps: torch.Tensor,
    labels: Sequence[str] | None,
    layer: int,
    head: int,
    path: str | os.PathLike[str],
    col_labels: Sequence[str] | None = None,
    causal: bool = True,
) -> tuple[int, int]:
    """One head: ``maps[layer, head]`` as a (T, T_k) heatmap with a colour bar."""
    L, H, T, _ = maps.shape
    _check_index("layer", layer, L)
    _check_index("head", head, H)
    side = min(14.0, max(4.0, 2.0 + 0.25 * T))
    with _rc():
        fig = _figure(side + 1.2, side)
        ax = fig.add_axes((0.15, 0.15, 0.68, 0.75))
        weights = maps[layer, head]
        image = _draw(ax, weights, labels, float(weights.max()), _label_size(T), col_labels, causal)
        title = "A = softmax(QKᵀ/√d_k + M)" if col_labels is None else "A = softmax(Q_dec·K_encᵀ/√d_k)"
        ax.set_title(f"layer {layer}, head {head}: {title}", fontsize=10)
        ax.set_xlabel("key position j (attended to)")
        ax.set_ylabel("query position i")
        fig.colorbar(image, cax=fig.add_axes((0.86, 0.15, 0.03, 0.75)))
        return _save(fig, path)


def plot_layer(
    maps: torch.Tensor,
    labels: Sequence[str] | None,
    layer: int,
    path: str | os.PathLike[str],
    col_labels: Sequence[str] | None = None,
    causal: bool = True,
) -> tuple[int, int]:
    """Every head of one layer, in a near-square grid."""
    L, H, T, _ = maps.shape
    _check_index("layer", layer, L)
    ncols = math.ceil(math.sqrt(H))
    nrows = math.ceil(H / ncols)
    cell = min(8.0, max(2.5, 1.5 + 0.18 * T))
    with _rc():
        fig = _figure(ncols * cell, nrows * cell + 0.6)
        vmax = float(maps[layer].max())
        axes = fig.subplots(nrows, ncols, squeeze=False)
        for i, ax in enumerate(axes.flat):
            if i >= H:
                ax.set_axis_off()
                continue
            _draw(ax, maps[layer, i], labels, vmax, _label_size(T) * 0.8, col_labels, causal)
            ax.set_title(f"head {i}", fontsize=9)
        fig.suptitle(f"layer {layer}: attention of every head (rows: queries, columns: keys)")
        fig.tight_layout()
        return _save(fig, path)


def plot_overview(maps: torch.Tensor, path: str | os.PathLike[str], causal: bool = True) -> tuple[int, int]:
    """All layers × heads as small maps (no token labels)."""
    L, H, T, _ = maps.shape
    cell = 1.3
    with _rc():
        fig = _figure(H * cell + 0.6, L * cell + 0.8)
        axes = fig.subplots(L, H, squeeze=False)
        for layer in range(L):
            vmax = float(maps[layer].max())
            for head in range(H):
                ax = axes[layer, head]
                _draw(ax, maps[layer, head], None, vmax, 6, causal=causal)
                if layer == 0:
                    ax.set_title(f"head {head}", fontsize=8)
                if head == 0:
                    ax.set_ylabel(f"layer {layer}", fontsize=8)
        fig.suptitle(f"attention, {L} layers × {H} heads, {T} tokens")
        return _save(fig, path)


__all__ = ["FORMATS", "image_format", "plot_head", "plot_layer", "plot_overview"]
