"""What a captured static-path step computes: per-row state buffers, the decode step and the prefill.

``decode_bucket`` is the function ``StaticSession`` compiles and captures as a CUDA graph (one per
batch-size bucket); ``prefill_rows`` fills rows of the static cache from prompts. Both read and write
only fixed-address buffers (``RowState`` and the ``StaticKVCache``), so that a graph may replay them:

    step(b):    x_r = next_r;  pos_r = length_r;  write k, v at pos_r;  attend over j ≤ pos_r
                next_r = sample(penalise(logits_r));  length_r += live_r;  counts_r[next_r] += live_r
"""

from __future__ import annotations

from typing import Protocol

import torch

from gptlab.generate.decoder import Decoder, logits_of
from gptlab.generate.sampling import ROW_OPTIONS, ROW_SAMPLERS, penalise
from gptlab.model.kvcache import KVStore, KVView, StaticKVCache, mark_static


class RowState:
    """Per-row decoding state as tensors at fixed addresses: what a captured step reads and writes.

    (Plain attributes, not a module's buffers, for the reason ``StaticKVCache`` gives.)
    """

    length: torch.Tensor
    next_token: torch.Tensor
    live: torch.Tensor
    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor
    seed: torch.Tensor
    repetition: torch.Tensor
    frequency: torch.Tensor
    presence: torch.Tensor
    counts: torch.Tensor
    bias: torch.Tensor

    def __init__(self, n: int, vocab: int, device: torch.device) -> None:
        spec = {
            "length": torch.long,  # positions cached = the next token's position
            "next_token": torch.long,  # sampled, not yet cached
            "live": torch.bool,  # False: the row keeps its state this step (idle or paused)
            **dict.fromkeys(ROW_OPTIONS, torch.float32),  # temperature, top_p, penalties, ...
            "top_k": torch.long,
            "seed": torch.long,
        }
        for name, dtype in spec.items():
            setattr(self, name, mark_static(torch.zeros(n, dtype=dtype, device=device)))
        for name in ("repetition", "top_p"):  # idle rows hold neutral options (l/1, keep all)
            getattr(self, name).fill_(1.0)
        self.top_k.fill_(vocab)
        for name in ("counts", "bias"):  # (n, V): token counts of each row's history, its logit bias
            setattr(self, name, mark_static(torch.zeros(n, vocab, device=device)))
        self._names = [*spec, "counts", "bias"]

    # (rows as start, stop: a slice object holding a symbolic size would make dynamo specialise it)
    def options(self, start: int, stop: int) -> list[torch.Tensor]:
        """What the row sampler takes after the logits, for rows ``[start, stop)``."""
        return [getattr(self, n)[start:stop] for n in ("temperature", "top_k", "top_p", "min_p", "seed")]

    def penalised(self, logits: torch.Tensor, start: int, stop: int) -> torch.Tensor:
        return penalise(
            logits,
            self.counts[start:stop],
            self.repetition[start:stop],
            self.frequency[start:stop],
            self.presence[start:stop],
            self.bias[start:stop],
        )

    def move(self, dst: int, src: int) -> None:
        for name in self._names:
            t = getattr(self, name)
            t[dst] = t[src]


class StaticRows(Protocol):
    """What a static step reads of its session (``StaticSession`` is one)."""

    model: Decoder
    cache: StaticKVCache
    state: RowState
    vocab: int


def decode_bucket(
    session: StaticRows,
    bucket: torch.Tensor,
    flavour: str,
    horizon: torch.Tensor | None = None,
    model: Decoder | None = None,
) -> None:
    """One token for rows ``[0, b)``, ``b = len(bucket)``: every shape fixed by ``b``, every other
    tensor a static buffer. (``b`` comes as a tensor's size so that one compilation, with ``b`` a
    symbol, serves every bucket.) ``horizon`` (a CPU's): attend over cache positions ``[0, h)``,
    ``h = len(horizon)``, not all ``T_max`` (each row's ``length + steps ≤ h``). ``model`` is the
    session's, reached through a module that ``torch.compile`` freezes on a CPU
    (``gptlab.generate.frozen_step``)."""
    b = bucket.size(0)
    s = session.state
    model = session.model if model is None else model
    cfg = model.config
    caches = [session.cache.layer(i) for i in range(cfg.n_layer)]
    # the cache's length (or the horizon) as a size, which dynamo keeps a symbol across sessions
    t_max = caches[0][0].size(2) if horizon is None else horizon.size(0)
    pos = s.length[:b].clamp(max=t_max - 1)  # (b,) an idle row never writes out of bounds
    # each layer: write k_t of row r at pos_r, attend over all T_max slots (masked to j ≤ pos_r);
    # rows [0, b) as views of the buffers (a slice holding the symbol b would make dynamo specialise it)
    layers = [KVView(KVStore(k[:b, :, :t_max], v[:b, :, :t_max]), write=pos, end=t_max) for k, v in caches]
    keys = torch.arange(t_max, device=pos.device)
    mask = (keys[None, :] <= pos[:, None])[:, None, None, :]  # (b, 1, 1, T_max)
    out = model.run(s.next_token[:b, None], pos=pos[:, None], cache=layers, attn_mask=mask, last_only=True)
    logits = s.penalised(logits_of(out)[:, -1, : session.vocab].float(), 0, b)  # (b, V)
    token = ROW_SAMPLERS[flavour](logits, *s.options(0, b), pos)
    live = s.live[:b]
    s.next_token[:b] = torch.where(live, token, s.next_token[:b])
    s.length[:b] += live.long()
    s.counts[:b].scatter_add_(1, token[:, None], live.to(s.counts.dtype)[:, None])  # the history grows


def prefill_rows(
    session: StaticRows, idx: torch.Tensor, r0: int, last: torch.Tensor, flavour: str
) -> torch.Tensor:
    """Fill rows ``[r0, r0 + n)`` with right-padded prompts ``idx`` (n, T) → each row's first token (n,).

    Causal attention means a real token never sees the padding after it; ``last`` (n,) holds the
    index of each prompt's last token, whose logits are sampled.
    """
    s, model = session.state, session.model
    n, T = idx.shape
    # each layer: store positions [0, T) of rows [r0, r0 + n), attend over the prompts' own keys
    layers = [
        KVView(KVStore(k[r0 : r0 + n, :, :T], v[r0 : r0 + n, :, :T]), write=0)
        for k, v in map(session.cache.layer, range(model.config.n_layer))
    ]
    pos = torch.arange(T, device=idx.device)
    logits = logits_of(model.run(idx, pos=pos, cache=layers))  # (n, T, V)
    rows = torch.arange(n, device=idx.device)
    chosen = s.penalised(logits[rows, last, : session.vocab].float(), r0, r0 + n)  # (n, V)
    return ROW_SAMPLERS[flavour](chosen, *s.options(r0, r0 + n), last)
