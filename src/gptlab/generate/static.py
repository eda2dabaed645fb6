"""Decoding whose shapes never change: a static KV cache, batch-size buckets, its step, CUDA graphs and the frozen CPU step.

A decode step on a GPU is launch overhead (GPT-2 124M reads 249 MB of bf16 weights a step, 0.08 ms
on an H100, but hundreds of kernel launches take milliseconds). Captured once as a CUDA graph and
replayed, the step costs about its memory traffic. A graph fixes every shape and address, so:

    cache:      StaticKVCache, rows (B_max, H_kv, T_max, d_k) at fixed addresses
    rows:       active sequences are rows [0, n) of the cache; a bucket b ≥ n runs rows [0, b)
                (rows n..b−1 are idle: they compute, but write only into their own free rows)
    state:      per row, as tensors: length (the next position), next token, live, sampling options,
                token counts (for the penalties) and logit bias
    step(b):    x_r = next_r;  pos_r = length_r;  write k, v at pos_r;  attend over j ≤ pos_r
                next_r = sample(penalise(logits_r));  length_r += live_r;  counts_r[next_r] += live_r
                                                                        (all inside the graph)

One graph per bucket (1, 2, 4, …, ``max_batch``) and sampler flavour, captured on first use through
``torch.compile(mode="reduce-overhead", fullgraph=True)``: the step is compiled once per flavour
with the bucket as a symbol, and inductor records one CUDA graph per bucket size. A sequence joins by a prefill into the
next free row (prefill is compiled with dynamic shapes: prompts vary); one leaves by moving the last
row into its place. Neither touches a graph, so nothing is re-captured.

``StaticSession`` is a ``Session`` (``gptlab.generate.session``) like ``BatchSession`` but
samples inside the step: ``add_many(prompts, configs)`` returns each slot's first token, ``step``
the next one. The dynamic ``BatchSession`` stays the reference; greedy tokens of both agree, with
and without penalties (tested on the CPU, where ``step="eager"`` runs the same step eagerly).

What a captured step computes: per-row state buffers (``RowState``), the decode step and the prefill.

``decode_bucket`` is the function ``StaticSession`` compiles and captures as a CUDA graph (one per
batch-size bucket); ``prefill_rows`` fills rows of the static cache from prompts. Both read and write
only fixed-address buffers (``RowState`` and the ``StaticKVCache``), so that a graph may replay them:

    step(b):    x_r = next_r;  pos_r = length_r;  write k, v at pos_r;  attend over j ≤ pos_r
                next_r = sample(penalise(logits_r));  length_r += live_r;  counts_r[next_r] += live_r

``FrozenStep``, the static decode step on a CPU: weights frozen into the graph and packed once for inductor's GEMM.

A decode step of ``b`` rows multiplies a ``(b, K)`` block by every weight matrix, ``Y = X·Wᵀ``.
Called eagerly, MKL's ``sgemm`` re-packs W into its blocked layout on every call, and for a few
rows that packing and its threading cost more than the arithmetic: for a handful of rows the
weights stream far below the memory's rate (docs/benchmarks.md#decoding).

Compiled with inductor's ``freezing``, the weights become constants of the graph: inductor packs
each one once, at compile time, and ``max_autotune`` with its ``CPP`` GEMM back-end generates a
C++ micro-kernel per shape (``CppMicroGemmFP32Vec``: register blocks of rows × columns, W
streamed once for all ``b`` rows), several times faster for a few rows.
``b`` stays a symbol (the bucket), so one compilation serves every bucket, as on CUDA.

Freezing holds only for parameters that the compiled *module* owns, so the step runs through
``FrozenStep(model)``, whose forward passes its own ``model`` to the step; the session's cache and
row state stay ordinary inputs (they change every step). Frozen weights are copies of the
weights at compile time: ``FrozenStep.stale()`` notices a weight written in place since (its
version counter moved), and the model's ``PreparedDecoding`` then compiles again rather than decode with old weights.
Cost: a compilation of minutes on a small CPU (the GEMM autotuning benchmarks each shape once;
inductor keeps the choices on disk) and one more copy of the matrices, packed.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import torch
from torch import nn

from gptlab.compiling import Compiled
from gptlab.errors import GptlabError
from gptlab.generate.config import SampleConfig
from gptlab.generate.plan import Decoder, logits_of
from gptlab.generate.sampling import ROW_OPTIONS, ROW_SAMPLERS, penalise, row_options
from gptlab.generate.session import Window, release_after_pass
from gptlab.model.kvcache import KVStore, KVView, StaticKVCache, default_cache_dtype, mark_static

# (torch leaves it unannotated)
mark_step_begin: Callable[[], None] = torch.compiler.cudagraph_mark_step_begin
#: the plan's steps a static session runs (``gptlab.generate.plan.STEPS``)
STATIC_STEPS = frozenset({"eager", "frozen", "cuda-graphs", "compiled"})
#: Steps run back to back per host sync on CUDA (``StaticSession(lookahead=...)``)
LOOKAHEAD = 8
#: On a CPU a step attends over the cache positions its rows reach, rounded up to this
HORIZON = 64


def buckets_for(max_batch: int) -> list[int]:
    """Batch sizes that get a graph: powers of two below ``max_batch``, then ``max_batch``.

    >>> buckets_for(6)
    [1, 2, 4, 6]
    """
    sizes = [1 << i for i in range(max_batch.bit_length()) if 1 << i < max_batch]
    return sizes + [max_batch]


class StaticSession:
    """Slots of a static cache, decoded by captured steps (see the module docstring).

    ``lookahead`` (k): a step that must run the device runs k steps back to back and reads their
    tokens with one host sync; later calls hand those tokens out without the device. The tokens
    are the same for every k (each row's sampler draws from its seed and position); a row that
    stops mid-way leaves at most k − 1 unused tokens. Default: ``LOOKAHEAD`` with CUDA graphs (the
    host's per-step work then overlaps the GPU's), 1 elsewhere.

    ``step``: the plan's step (``gptlab.generate.plan.STEPS``), carried out as given: ``"eager"`` runs
    the step function eagerly, ``"cuda-graphs"`` and ``"compiled"`` through ``torch.compile``
    (``compile_options`` replaces its settings, e.g. a test's backend), ``"frozen"`` compiles it on a
    CPU with the weights frozen in; ``frozen`` (the model's ``PreparedDecoding``'s) shares those
    steps between sessions. The session decides nothing of it (``plan_decoding`` does).
    """

    def __init__(
        self,
        model: Decoder,
        max_batch: int,
        max_len: int | None = None,
        cache_dtype: torch.dtype | None = None,
        vocab: int | None = None,
        step: str = "eager",
        compile_options: Mapping[str, object] | None = None,
        slot_base: int = 0,
        lookahead: int | None = None,
        frozen: FrozenSteps | None = None,
    ) -> None:
        config = model.config
        self.window = Window(model, max_batch, max_len)
        device = model.device
        self.model, self.max_batch, self.max_len = model, max_batch, self.window.max_len
        max_len = self.max_len
        self.slot_base = slot_base  # slots are numbered slot_base .. slot_base + max_batch − 1
        self.vocab = min(vocab or config.vocab_size, config.vocab_size)
        dtype = cache_dtype or default_cache_dtype(model.dtype, device)
        with torch.inference_mode(False), torch.no_grad():
            self.cache = StaticKVCache(config, max_batch, max_len, dtype, device)
            self.state = RowState(max_batch, self.vocab, device)
        self.buckets = buckets_for(max_batch)
        self._marks = {b: torch.zeros(b, device=device) for b in self.buckets}  # their sizes: the buckets
        self._horizons: dict[int, torch.Tensor] = {}  # a CPU's attended lengths, as sizes
        if step not in STATIC_STEPS:
            raise GptlabError(f"a static session runs one of {sorted(STATIC_STEPS)}, not {step!r}")
        compile = step != "eager"
        options: dict[str, Any] = dict(compile_options or {"mode": "reduce-overhead", "fullgraph": True})
        self._compile, self._options = compile, options
        # a CPU compiles its step with the weights frozen in (gptlab.generate.static); prompts
        # vary, and an eager prefill there costs less than compiling one for every length
        frozen_here = step == "frozen"
        #: the frozen CPU steps this session runs (None: its own compiled or eager step)
        self.frozen = (frozen or FrozenSteps(model)) if frozen_here else None
        self._steps: dict[str, Compiled] = {}  # the compiled step per sampler flavour
        self._graphs: set[tuple[int, str]] = set()  # (bucket, flavour) graphs captured so far
        # prompts vary: one kernel set for every shape, no CUDA graph (it would be one per shape)
        prefill_options = {k: v for k, v in options.items() if k != "mode"}
        #: the prefill (compiled on CUDA with dynamic shapes; eager on a CPU)
        self.prefill_step = Compiled(
            prefill_rows,
            "the static prefill",
            True,
            device_type=device.type,
            enabled=compile and not frozen_here,
            distinct_sizes=device.type == "cpu",
            **prefill_options,
        )
        self.rows: list[int] = []  # rows[r] = the slot held in cache row r
        self._row_of: dict[int, int] = {}  # its inverse
        self.tokens: dict[int, list[int]] = {}  # slot -> ids whose keys/values are cached
        self._greedy: dict[int, bool] = {}
        self._pending: dict[int, int] = {}  # slot -> its sampled token, not yet cached
        self._live_rows: tuple[int, ...] = ()
        if lookahead is None:
            lookahead = LOOKAHEAD if step == "cuda-graphs" else 1
        if not isinstance(lookahead, int) or lookahead < 1:
            raise GptlabError(f"lookahead must be a positive integer, got {lookahead!r}")
        self.lookahead = lookahead
        self._ahead: dict[int, deque[int]] = {}  # slot -> tokens chosen ahead, not yet handed out
        self.host_reads = 0  # device → host reads of chosen tokens: one per run of k steps
        self._chosen = torch.zeros(lookahead, max_batch, dtype=torch.long, device=device)

    # ------------------------------------------------------------ slots
    @property
    def free_slots(self) -> int:
        return self.max_batch - len(self.rows)

    @property
    def graphs(self) -> list[tuple[int, str]]:
        """The ``(bucket, flavour)`` step graphs used so far, each captured once."""
        return sorted(self._graphs)

    @property
    def captures(self) -> int:
        return len(self._graphs)

    @property
    def horizons(self) -> list[int]:
        """The cache lengths a CPU's steps have attended over so far (multiples of ``HORIZON``)."""
        return sorted(self._horizons)

    @property
    def queued(self) -> dict[int, int]:
        """``{slot: tokens chosen ahead (lookahead) and not yet handed out}``."""
        return {slot: len(q) for slot, q in self._ahead.items()}

    @property
    def compiled(self) -> bool:
        """True while every step built so far runs through ``torch.compile`` (no silent fallback)."""
        return bool(self._steps) and all(c.enabled and c.compiled_calls for c in self._steps.values())

    def length(self, slot: int) -> int:
        self._check(slot)
        return len(self.tokens[slot])

    def full(self, slot: int) -> bool:
        """True when ``slot`` holds ``max_len`` tokens: its next step slides the window."""
        return self.length(slot) >= self.max_len

    def window_notice(self) -> str:
        """What happens past the context, in one sentence (shown once per request)."""
        return self.window.notice()

    def fit(self, ids: Sequence[int]) -> list[int]:
        """``ids`` as a list, cut to its last ``max_len`` tokens (with a ``ContextWarning``)."""
        return self.window.fit(ids)

    def _check(self, slot: int) -> None:
        if slot not in self.tokens:
            raise GptlabError(f"slot {slot!r} is not in use; use a slot returned by add_many()")

    def bucket(self, n: int) -> int:
        """The smallest bucket holding ``n`` rows."""
        return next(b for b in self.buckets if b >= n)

    def remove(self, slot: int) -> None:
        """Free ``slot``: the last row moves into its place (no graph changes)."""
        self._check(slot)
        r, last = self._row_of.pop(slot), len(self.rows) - 1
        with torch.inference_mode():
            if r != last:
                self.cache.move_row(r, last, len(self.tokens[self.rows[last]]))
                self.state.move(r, last)
            self.state.live[last] = False
        self.rows[r] = self.rows[last]
        self.rows.pop()
        if r != last:
            self._row_of[self.rows[r]] = r
        del self.tokens[slot], self._greedy[slot], self._pending[slot], self._ahead[slot]
        self._live_rows = ()

    # ------------------------------------------------------------ passes
    @torch.inference_mode()
    def add_many(
        self, prompts: Sequence[Sequence[int]], configs: Sequence[SampleConfig], seeds: Sequence[int]
    ) -> list[tuple[int, int]]:
        """Prefill prompts into free rows (one right-padded pass) → ``(slot, first token)`` each."""
        ids = [self.fit(p) for p in prompts]
        if len(ids) > self.free_slots:
            raise GptlabError(f"the session has {self.free_slots} free slot(s) but {len(ids)} are needed")
        used = set(self.rows)
        slots = [s for s in range(self.slot_base, self.slot_base + self.max_batch) if s not in used]
        slots = slots[: len(ids)]
        r0, n = len(self.rows), len(ids)
        device = self.model.device
        options = [row_options(c, self.vocab, seed) for c, seed in zip(configs, seeds, strict=True)]
        s = self.state
        for j, name in enumerate(ROW_OPTIONS):
            getattr(s, name)[r0 : r0 + n] = torch.tensor(
                [o[j] for o in options], device=device, dtype=getattr(s, name).dtype
            )
        counts, bias = (
            torch.zeros(n, self.vocab),
            torch.zeros(n, self.vocab),
        )  # built on the host: one copy each
        for b, (p, c) in enumerate(zip(ids, configs, strict=True)):
            seen = torch.tensor([t for t in p if t < self.vocab], dtype=torch.long)
            counts[b] = torch.bincount(seen, minlength=self.vocab)
            for t, value in c.logit_bias.items():
                if t < self.vocab:
                    bias[b, t] += value
        s.counts[r0 : r0 + n] = counts.to(device)
        s.bias[r0 : r0 + n] = bias.to(device)
        T = max(map(len, ids))
        idx = torch.tensor([p + [0] * (T - len(p)) for p in ids], dtype=torch.long, device=device)
        last = torch.tensor([len(p) - 1 for p in ids], device=device)
        flavour = "greedy" if all(o[0] <= 0 for o in options) else "sample"
        first = self.prefill_step(self, idx, r0, last, flavour)
        s.next_token[r0 : r0 + n] = first
        s.length[r0 : r0 + n] = last + 1
        s.live[r0 : r0 + n] = False
        s.counts[r0 : r0 + n].scatter_add_(1, first[:, None], torch.ones_like(s.counts[:n, :1]))
        tokens = first.tolist()
        for b, slot in enumerate(slots):
            self._row_of[slot] = len(self.rows)
            self.rows.append(slot)
            self.tokens[slot] = list(ids[b])
            self._greedy[slot] = options[b][0] <= 0
            self._pending[slot] = tokens[b]
            self._ahead[slot] = deque()
        self._live_rows = ()
        return list(zip(slots, tokens, strict=True))

    @torch.inference_mode()
    def step(self, feed: dict[int, int] | Sequence[int]) -> dict[int, int]:
        """Cache each fed slot's pending token and sample its next one → ``{slot: token}``.

        ``feed`` names the slots to advance (a ``{slot: token}`` dict's tokens must be the ones
        this session chose); the other slots wait with their state unchanged. A slot whose
        tokens were chosen ahead (``lookahead``) gets the next one without touching the device.
        """
        slots = sorted(feed)
        for slot in slots:
            self._check(slot)
        need = [s for s in slots if not self._ahead[s]]
        if need:
            self._run_ahead(need, [len(self._ahead[s]) for s in slots if self._ahead[s]])
        out = {}
        for slot in slots:
            self.tokens[slot].append(self._pending[slot])
            out[slot] = self._pending[slot] = self._ahead[slot].popleft()
        return out

    def _run_ahead(self, slots: list[int], queued: list[int]) -> None:
        """Run ``k`` steps of the rows of ``slots`` back to back, then read their tokens at once.

        k = min(lookahead, room left in each row's window, the shortest queue of the other fed
        rows): rows that joined late catch up with the others' queues, so that fed rows run
        together again. Each row's state on the device is its handed-out tokens plus its queue.
        """
        for slot in slots:
            if len(self.tokens[slot]) >= self.max_len:
                self._slide(slot)
        k = min([self.lookahead, *queued, *(self.max_len - len(self.tokens[s]) for s in slots)])
        rows = tuple(sorted(self._row_of[s] for s in slots))
        if rows != self._live_rows:  # a host→device copy only when the set of live rows changes
            live = torch.zeros(self.max_batch, dtype=torch.bool)
            live[list(rows)] = True
            self.state.live.copy_(live)
            self._live_rows = rows
        n = len(self.rows)
        b = self.bucket(n)
        flavour = "greedy" if all(self._greedy[s] for s in slots) else "sample"
        graph = self._graph(b, flavour)
        horizon = self._horizon(k)
        for i in range(k):
            if self._compile and self.model.device.type == "cuda":
                mark_step_begin()  # a new step: earlier replays are finished with
            graph(self, self._marks[b], flavour, *horizon)
            self._chosen[i, :n].copy_(self.state.next_token[:n])
        chosen = self._chosen[:k, :n].T.tolist()  # the one host sync of k steps: (n, k)
        self.host_reads += 1
        for slot in slots:
            self._ahead[slot].extend(chosen[self._row_of[slot]])

    def _horizon(self, k: int) -> tuple[torch.Tensor, ...]:
        """On a CPU, the cache positions the next ``k`` steps attend over, rounded up to a multiple
        of ``HORIZON``: ``(tensor of that size,)``. A long context (a server's 1,024) is then read only as
        far as its rows reach. () on CUDA, where each size would be another CUDA graph."""
        if self.model.device.type == "cuda":
            return ()
        # a row's length on the device is its cached tokens plus those chosen ahead
        need = max(len(self.tokens[s]) + len(self._ahead[s]) for s in self.rows) + k
        h = min(self.max_len, -(-need // HORIZON) * HORIZON)
        if h not in self._horizons:
            self._horizons[h] = torch.zeros(h, device=self.model.device)
        return (self._horizons[h],)

    def _graph(self, b: int, flavour: str) -> Compiled:
        """The step of ``flavour``: compiled once with the bucket ``b`` a symbol (1 apart), and
        captured as one CUDA graph per bucket (inductor records a graph per distinct size)."""
        if self.frozen is not None:
            self._steps[flavour] = self.frozen.get(flavour)
        elif flavour not in self._steps:
            self._steps[flavour] = Compiled(
                decode_bucket,
                f"the static decode step ({flavour})",
                True,
                device_type=self.model.device.type,
                enabled=self._compile,
                distinct_sizes=self.model.device.type == "cpu",  # (a CUDA cache's sizes are static)
                **self._options,
            )
        self._graphs.add((b, flavour))
        return self._steps[flavour]

    def _slide(self, slot: int) -> None:
        """Rebuild a full row from its last ``keep`` cached tokens (positions restart at 0)."""
        kept = self.tokens[slot][len(self.tokens[slot]) - self.window.keep :]
        r = self._row_of[slot]
        if kept:  # (a context of one token keeps none: the pending token starts an empty row)
            idx = torch.tensor([kept], dtype=torch.long, device=self.model.device)
            self.prefill_step(self, idx, r, torch.tensor([len(kept) - 1], device=idx.device), "greedy")
        self.state.length[r] = len(kept)
        self.tokens[slot] = kept


# ------------------------------------------------------------ static_step
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
    (``gptlab.generate.static``)."""
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
    release_after_pass(idx)
    return ROW_SAMPLERS[flavour](chosen, *s.options(r0, r0 + n), last)


# ------------------------------------------------------------ frozen_step
#: inductor settings of the frozen step (``Compiled``'s ``patch``: held while it compiles)
FROZEN = {"freezing": True, "max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN"}


class FrozenStep(nn.Module):
    """``decode_bucket`` with ``model`` as this module's own child, so that freezing folds its weights."""

    def __init__(self, model: Decoder) -> None:
        super().__init__()
        if not isinstance(model, nn.Module):
            raise GptlabError(f"the frozen step freezes a module's weights; got a {type(model).__name__}")
        self.model = model
        self._tensors = [t for t in model.state_dict(keep_vars=True).values() if t is not None]
        self.versions = self._versions()

    def _versions(self) -> int:
        return sum(t._version for t in self._tensors)

    def stale(self) -> bool:
        """True once a weight was written in place after this step was built (frozen copies are old)."""
        return self._versions() != self.versions

    def forward(
        self, session: StaticRows, bucket: torch.Tensor, flavour: str, horizon: torch.Tensor | None = None
    ) -> None:
        return decode_bucket(session, bucket, flavour, horizon, model=self.model)


def frozen_step(model: Decoder, flavour: str) -> Compiled:
    """The CPU static step of ``flavour`` for ``model``, weights frozen (compiled at its first call).

    Every session of the model may share it: the model's ``PreparedDecoding`` keeps it, and builds
    another once ``stale(step)`` says a weight changed."""
    what = f"the static decode step ({flavour}, frozen weights)"
    return Compiled(FrozenStep(model), what, True, patch=FROZEN, distinct_sizes=True, fullgraph=True)


class FrozenSteps:
    """A model's frozen steps, one per sampler flavour, built at first use and again once stale.

    The model's ``PreparedDecoding`` holds one, so that every static session of the model shares them."""

    def __init__(self, model: Decoder) -> None:
        self.model = model
        self.steps: dict[str, Compiled] = {}

    def get(self, flavour: str) -> Compiled:
        step = self.steps.get(flavour)
        if step is None or (isinstance(step.fn, FrozenStep) and step.fn.stale()):
            step = self.steps[flavour] = frozen_step(self.model, flavour)
        return step
