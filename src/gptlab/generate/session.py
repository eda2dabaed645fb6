"""``BatchSession``: prefill, then batched one-token decode steps over a shared KV cache.

Every row ("slot") of the cache holds one sequence between its own ``start`` and
``end``; rows can have different lengths (ragged continuous batching) and a
left-padded batch is the special case where every row ends at the same place
but starts after its padding. For one decode step over slots ``s``:

    write k_new, v_new of slot s at cache index end_s
    pos_s  = end_s − start_s                     (per-sequence positions)
    mask_s = [start_s ≤ j ≤ end_s]               (keys a slot may see)
    attend over K_cache[:, :, :max_s end_s + 1]

ALiBi's bias ``−m·(i − j)`` is computed from the last key slot; for a shorter row
that shifts the scores of the whole row by a constant, which softmax ignores.

When a slot fills the cache (``full``), the next step slides a window over the text
(``gptlab.generate.session``: rebuilt from ¾ of the row with relative positions, re-run without a
cache with absolute ones, nanoGPT's ``idx[:, -block_size:]``). Either way the logits equal the uncached model's on the window the row holds.

Memory: ``max_len`` is how long a row may get, ``capacity`` how many positions are allocated now.
By default both are ``max_len``. A session made with a smaller ``capacity`` (the server's: a model
with an 8,192-token context would otherwise hold ``2·L·B·H_kv·8192·d_k`` numbers, 2.9 GB for
SmolLM2 at 8 rows, before its first request) doubles it whenever a row needs more, up to
``max_len``, and drops back to the starting capacity when every slot is free again, or, with
``shrink_when_idle = False`` (the server's, which keeps the grown cache for an idle grace period so
that the next request does not pay the re-allocation), when its owner calls ``shrink()``.

What every session shares (this dynamic one, ``StaticSession`` and the server's ``Lanes``): the ``Session``
protocol, its size checks and the window past the context.

A session holds ``max_batch`` rows of a KV cache, each row at most ``max_len`` tokens. When a row is
full its next step slides a window over the text:

    relative or no positions (RoPE, ALiBi, none): the row is rebuilt from its last
        ``keep = ¾·max_len`` tokens, then decoding goes on with the cache;
    absolute positions (learned, sinusoidal): a token's keys depend on its position,
        so every step re-runs the last ``keep = max_len − 1`` tokens.

``Window`` holds that rule, the one sentence that tells the user, and the prompt checks; the dynamic
``BatchSession``, the static ``StaticSession`` and the server's ``Lanes`` each hold one.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import torch

from gptlab.compiling import Compiled
from gptlab.errors import GptlabError
from gptlab.generate.plan import Decoder, logits_of
from gptlab.generate.prefix_cache import Layout, PrefixCache
from gptlab.generate.prompt_pass import MIN_TOKENS as PROMPT_MIN_TOKENS
from gptlab.hardware import release_memory
from gptlab.model.kvcache import KVView, Rows, default_cache_dtype, make_store

#: a prompt's pass over one row's cache views: ``(model, idx, pos, keys, values) → logits (1, vocab)``
PromptPass = Callable[
    [Decoder, torch.Tensor, torch.Tensor, list[torch.Tensor], list[torch.Tensor]], torch.Tensor
]


def _rows(slots: Sequence[int]) -> Rows:
    """A slice when the slots are consecutive (the cache read is then a view), else an index tensor."""
    first = slots[0]
    if list(slots) == list(range(first, first + len(slots))):
        return slice(first, first + len(slots))
    return torch.tensor(list(slots), dtype=torch.long)


class BatchSession:
    """A KV cache of ``max_batch`` rows and the forward passes that fill it.

    ``add(prompt_ids) -> (slot, logits)`` prefills a free row; ``step({slot: token})``
    runs one batched decode step; ``remove(slot)`` frees the row.
    """

    def __init__(
        self,
        model: Decoder,
        max_batch: int,
        max_len: int | None = None,
        cache_dtype: torch.dtype | None = None,
        capacity: int | None = None,
        one_token: Compiled | None = None,
        prompt: PromptPass | None = None,
        prefix_cache: PrefixCache | None = None,
        first_step: Callable[[], None] | None = None,
    ) -> None:
        """``one_token``: a compiled ``fused_step.decode_one_token`` to run each step that feeds one row
        (from position 0) of a float cache: the model's ``PreparedDecoding`` gives it where the plan of
        one row says ``fused`` (a session of several rows: only once the compile cache keeps the step).
        ``prompt``: the kept prompt pass (``gptlab.generate.prompt_pass.KeptPrompt``) to prefill a prompt
        of one row from position 0 with no cached prefix, where the plan says ``prompt="kept"``.
        ``prefix_cache``: where prompts find the keys and values of a prefix seen before, and where
        prompts and freed rows leave theirs (``gptlab.generate.prefix_cache``). ``first_step``: called
        once, before the first decode step (the model's engine then moves its weights onto huge pages)."""
        self._first_step = first_step
        config = model.config
        self.window = Window(model, max_batch, max_len)
        self.model = model
        self.max_batch, self.max_len = max_batch, self.window.max_len
        self.start_capacity = self.max_len if capacity is None else max(1, min(int(capacity), self.max_len))
        #: whether ``remove`` of the last row gives the grown capacity back at once (else: ``shrink()``)
        self.shrink_when_idle = True
        #: whether ``add_many`` leaves the prompts' blocks in the prefix cache at once; the server's session
        #: does it in ``remember_prompts()`` once their first tokens are out (not in the time to them)
        self.remember_at_add = True
        self._to_remember: list[int] = []
        device = model.device
        dtype = cache_dtype or default_cache_dtype(model.dtype, device)
        n_kv = config.n_kv_head or config.n_head  # (GPTConfig fills it in)
        with torch.inference_mode():
            self.stores = [
                make_store(max_batch, n_kv, self.start_capacity, config.head_dim, dtype, device)
                for _ in range(config.n_layer)
            ]
        #: the compiled one-row step this session runs for a step of one row (the plan's "fused": one
        #: row, a float cache, a CPU), or None (layer by layer); given by ``PreparedDecoding``, never
        #: re-decided here
        self.one_token = one_token
        #: the kept prompt pass, or None (every prompt through ``_run``); given by ``PreparedDecoding``
        self.prompt = prompt
        #: what ``GPT.run`` takes as ``cache``: one view per layer, aimed by ``_run`` before each pass
        self.layers = [KVView(s) for s in self.stores]
        #: per slot, each layer's key and value rows as views, for ``one_token`` (made once per slot and capacity)
        self._row_views: dict[int, tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]] = {}
        self.start = [0] * max_batch
        self.end = [0] * max_batch
        self.tokens: dict[int, list[int]] = {}  # slot -> ids whose keys/values are cached
        self.prefix_cache = prefix_cache if prefix_cache is not None and prefix_cache.enabled else None
        #: per stored tensor of a layer: its dtype and (L, H_kv, d), what a prefix cache's blocks must match
        self.layout: Layout = tuple(
            (t.dtype, (config.n_layer, t.size(1), t.size(3))) for t in self.stores[0].tensors()
        )

    # --------------------------------------------------------------- slots
    @property
    def free_slots(self) -> int:
        return self.max_batch - len(self.tokens)

    def length(self, slot: int) -> int:
        """Tokens cached for ``slot``."""
        self._check(slot)
        return self.end[slot] - self.start[slot]

    def full(self, slot: int) -> bool:
        """True when ``slot`` holds ``max_len`` tokens: its next step slides the window."""
        return self.end[slot] >= self.max_len

    def window_notice(self) -> str:
        """What happens past the context, in one sentence (shown once per request)."""
        return self.window.notice()

    def remove(self, slot: int) -> None:
        """Free ``slot``; with a prefix cache, its tokens' keys and values are kept there first."""
        self._check(slot)
        self._remember(slot)
        del self.tokens[slot]
        if self.shrink_when_idle:
            self.shrink()

    def shrink(self) -> bool:
        """With every slot free, give back what requests made the cache grow to (back to the starting
        capacity) → whether memory was given back."""
        if self.tokens or self.capacity <= self.start_capacity:
            return False
        self._resize(self.start_capacity)
        return True

    @property
    def grown(self) -> bool:
        """Whether the cache holds more positions than it started with."""
        return self.capacity > self.start_capacity

    @property
    def capacity(self) -> int:
        """Positions allocated per row now (``max_len`` at most)."""
        return self.stores[0].max_len

    def reserve(self, positions: int) -> None:
        """Make room for cache indices ``[0, positions)``: double the capacity until it fits (≤ ``max_len``)."""
        capacity = self.capacity
        if positions <= capacity:
            return
        while capacity < positions:
            capacity *= 2
        self._resize(min(capacity, self.max_len))

    def _resize(self, capacity: int) -> None:
        self._row_views.clear()  # views of the tensors being replaced
        with torch.inference_mode():
            for store in self.stores:
                store.resize(capacity)

    def _check(self, slot: int) -> None:
        if slot not in self.tokens:
            raise GptlabError(f"slot {slot!r} is not in use; use a slot returned by add()")

    def _take(self, n: int) -> list[int]:
        free = [s for s in range(self.max_batch) if s not in self.tokens]
        if len(free) < n:
            raise GptlabError(
                f"the session has {len(free)} free slot(s) but {n} are needed; "
                f"remove() finished sequences or make a session with a larger max_batch"
            )
        return free[:n]

    def fit(self, ids: Sequence[int]) -> list[int]:
        """``ids`` as a list, cut to its last ``max_len`` tokens (with a ``ContextWarning``)."""
        return self.window.fit(ids)

    # --------------------------------------------------------------- passes
    def add(self, prompt_ids: Sequence[int]) -> tuple[int, torch.Tensor]:
        """Prefill a free slot with ``prompt_ids`` → ``(slot, next-token logits (vocab,) float32)``."""
        return self.add_many([prompt_ids])[0]

    @torch.inference_mode()
    def add_many(self, prompts: Sequence[Sequence[int]]) -> list[tuple[int, torch.Tensor]]:
        """Prefill several prompts in one left-padded pass (a mask hides the padding).

        Row b holds its prompt at cache indices ``[P_b, T)`` with ``P_b = T − len_b``;
        positions are ``index − P_b``. A padding query row attends to itself only, so
        no softmax row is empty. With a prefix cache, row b's first ``m_b`` tokens are copied
        from it to ``[P_b, P_b + m_b)`` (the same positions) and the pass runs the queries from
        ``Q0 = min_b (P_b + m_b)`` only; the prompts that found a prefix and those that did not
        are prefilled in two passes, so a cold prompt does not make the others recompute theirs.
        """
        ids = [self.fit(p) for p in prompts]
        slots = self._take(len(ids))
        found = [self._lookup(p) for p in ids]
        logits: dict[int, torch.Tensor] = {}
        for hit in (False, True):
            group = [b for b, (m, _) in enumerate(found) if (m > 0) == hit]
            if group:
                out = self._prefill(
                    [slots[b] for b in group], [ids[b] for b in group], [found[b] for b in group]
                )
                logits.update(zip(group, out, strict=True))
        if self.remember_at_add:
            for s in slots:
                self._remember(s)  # the prompts' blocks, for the requests that come while these decode
        elif self.prefix_cache is not None:
            self._to_remember += slots
        return [(s, logits[b]) for b, s in enumerate(slots)]

    def remember_prompts(self) -> None:
        """Leave in the prefix cache the blocks of the rows added since the last call (with
        ``remember_at_add = False``): what each row holds now, its prompt and any tokens since."""
        slots, self._to_remember = self._to_remember, []
        for s in slots:
            if s in self.tokens:  # (a row removed since has left its blocks already)
                self._remember(s)

    def _prefill(
        self, slots: list[int], ids: list[list[int]], found: list[tuple[int, list[list[torch.Tensor]]]]
    ) -> list[torch.Tensor]:
        """One left-padded pass over ``ids`` into ``slots``, after the cached prefixes ``found``."""
        n, T = len(ids), max(map(len, ids))
        device = self.model.device
        pads = [T - len(p) for p in ids]
        q0 = min(pad + m for pad, (m, _) in zip(pads, found, strict=True))
        self.reserve(T)
        for s, pad, (_, blocks) in zip(slots, pads, found, strict=True):
            self._copy_in(s, pad, blocks)
        idx = torch.tensor(
            [([0] * pad + p)[q0:] for pad, p in zip(pads, ids, strict=True)], dtype=torch.long, device=device
        )
        if n == 1 and q0:  # one row after its cached prefix: positions are indices, key j ≤ query i
            i, j = torch.arange(q0, T, device=device), torch.arange(T, device=device)
            pos, mask = i, (j[None, :] <= i[:, None])[None, None]  # (1, 1, T − Q0, T)
        elif any(pads) or q0:
            start = torch.tensor(pads, device=device)[:, None]  # (n, 1)
            j = torch.arange(T, device=device)  # keys
            i = j[q0:]  # queries
            pos = (i[None, :] - start).clamp(min=0)  # (n, T − Q0)
            seen = (j[None, None, :] <= i[None, :, None]) & (j[None, None, :] >= start[:, :, None])
            mask = (seen | (j[None, None, :] == i[None, :, None]))[:, None]  # (n, 1, T − Q0, T)
        else:
            pos, mask = torch.arange(T, device=device), None
        if self.prompt is not None and n == 1 and mask is None and T >= PROMPT_MIN_TOKENS:
            keys, values = self._views_of(slots[0])  # (one row from position 0, no cached prefix)
            logits = self.prompt(self.model, idx, pos, keys, values)
            release_after_pass(idx)
        else:
            logits = self._run(idx, pos, mask, _rows(slots), q0, T)
        for b, s in enumerate(slots):
            self.start[s], self.end[s], self.tokens[s] = pads[b], T, list(ids[b])
        return [logits[b] for b in range(n)]

    # --------------------------------------------------------------- the prefix cache
    def _lookup(self, ids: list[int]) -> tuple[int, list[list[torch.Tensor]]]:
        if self.prefix_cache is None:
            return 0, []
        return self.prefix_cache.lookup_blocks(ids, self.layout)

    def _copy_in(self, slot: int, at: int, blocks: list[list[torch.Tensor]]) -> None:
        """Write a cached prefix (per block, per stored tensor: (L, H_kv, block_tokens, d)) into ``slot``
        from cache index ``at``: per layer and stored tensor, one ``cat`` of the blocks straight into the row."""
        if not blocks:
            return
        m = sum(b[0].size(2) for b in blocks)
        for kind in range(len(blocks[0])):
            for layer, store in enumerate(self.stores):
                row = store.tensors()[kind][slot, :, at : at + m]  # (H_kv, m, d), a view of the row
                torch.cat([b[kind][layer] for b in blocks], dim=1, out=row)

    @torch.inference_mode()
    def _remember(self, slot: int) -> None:
        """Leave ``slot``'s keys and values in the prefix cache, keyed by its tokens from position 0."""
        if self.prefix_cache is None:
            return
        start, stores = self.start[slot], self.stores

        def extract(a: int, b: int) -> list[torch.Tensor]:
            kinds = range(len(stores[0].tensors()))
            return [
                torch.stack([st.tensors()[k][slot, :, start + a : start + b] for st in stores]) for k in kinds
            ]

        self.prefix_cache.store(self.tokens[slot], self.layout, extract)

    @torch.inference_mode()
    def step(self, tokens: dict[int, int]) -> dict[int, torch.Tensor]:
        """Append one token to each given slot in one batched pass → next-token logits per slot."""
        slots = sorted(tokens)
        if not slots:
            return {}
        first, self._first_step = self._first_step, None
        if first is not None:
            first()
        for s in slots:
            self._check(s)
            if self.end[s] >= self.max_len:
                self._slide(s)
        device = self.model.device
        ends = [self.end[s] for s in slots]
        self.reserve(max(ends) + 1)
        starts = [self.start[s] for s in slots]
        idx = torch.tensor([[tokens[s]] for s in slots], dtype=torch.long, device=device)  # (n, 1)
        same_end = min(ends) == max(ends)
        if same_end and not any(starts):  # every row is the same length: no mask, shared position
            write: int | torch.Tensor = ends[0]
            pos = torch.tensor([ends[0]], device=device)
            mask = None
        else:
            end_t = torch.tensor(ends, device=device)
            start_t = torch.tensor(starts, device=device)
            write = ends[0] if same_end else end_t
            pos = (end_t - start_t)[:, None]  # (n, 1)
            j = torch.arange(max(ends) + 1, device=device)
            mask = ((j[None, :] >= start_t[:, None]) & (j[None, :] <= end_t[:, None]))[:, None, None, :]
        if self.one_token is not None and len(slots) == 1 and not starts[0]:  # one row, unmasked
            keys, values = self._views_of(slots[0])
            logits = self.one_token(self.model, idx, pos, keys, values, ends[0] + 1)
        else:
            logits = self._run(idx, pos, mask, _rows(slots), write, max(ends) + 1)
        out = {}
        for i, s in enumerate(slots):
            self.end[s] += 1
            self.tokens[s].append(int(tokens[s]))
            out[s] = logits[i]
        return out

    def _views_of(self, slot: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each layer's key and value rows of ``slot`` (1, H_kv, capacity, d): views, kept while the
        cache's tensors stay the same (60 slicing operations a step for a 30-layer model, otherwise)."""
        views = self._row_views.get(slot)
        if views is None or views[0] is not self.stores[0].k:
            row = slice(slot, slot + 1)
            keys, values = [st.k[row] for st in self.stores], [st.v[row] for st in self.stores]
            views = self._row_views[slot] = (self.stores[0].k, keys, values)
        return views[1], views[2]

    def room(self, slot: int) -> int:
        """Tokens ``slot`` can still take before its window must slide."""
        self._check(slot)
        return self.max_len - self.end[slot]

    @torch.inference_mode()
    def extend(self, slot: int, ids: Sequence[int]) -> torch.Tensor:
        """Append ``ids`` to one slot in one pass → the logits after each of them, ``(len(ids), vocab)``.

        Query i (cache index ``end + i``) sees the row's keys ``[start, end + i]``: what ``len(ids)``
        one-token steps would see. The ids must fit (``room``); ``rewind`` takes back those not kept.
        """
        self._check(slot)
        k, end, start = len(ids), self.end[slot], self.start[slot]
        if not 0 < k <= self.room(slot):
            raise GptlabError(f"extend: {k} tokens do not fit in slot {slot} ({self.room(slot)} left)")
        device = self.model.device
        self.reserve(end + k)
        idx = torch.tensor([list(ids)], dtype=torch.long, device=device)
        pos = torch.arange(end - start, end - start + k, device=device)
        mask = None  # the causal mask: queries are the last k of end + k keys
        if start:
            j = torch.arange(end + k, device=device)
            i = torch.arange(end, end + k, device=device)
            mask = ((j[None, :] >= start) & (j[None, :] <= i[:, None]))[None, None]  # (1, 1, k, end + k)
        logits = self._run(idx, pos, mask, slice(slot, slot + 1), end, end + k, last_only=False)
        self.end[slot] += k
        self.tokens[slot].extend(int(t) for t in ids)
        return logits[0]

    def rewind(self, slot: int, n: int) -> None:
        """Forget the last ``n`` tokens of ``slot`` (their keys stay in memory, past ``end``, unread)."""
        self._check(slot)
        if not 0 <= n <= self.length(slot):
            raise GptlabError(f"rewind: slot {slot} holds {self.length(slot)} tokens, cannot drop {n}")
        if n:
            self.end[slot] -= n
            del self.tokens[slot][-n:]

    @torch.inference_mode()
    def copy(self, dst: Sequence[int], src: Sequence[int]) -> None:
        """Slot ``dst[i]`` becomes a copy of slot ``src[i]`` (free destinations are taken)."""
        pairs = [(d, s) for d, s in zip(dst, src, strict=True) if d != s]
        if not pairs:
            return
        for d, s in pairs:
            self._check(s)
            if not 0 <= d < self.max_batch:
                raise GptlabError(f"slot {d} is outside 0..{self.max_batch - 1}")
        end = max(self.end[s] for _, s in pairs)
        d_idx = torch.tensor([d for d, _ in pairs], dtype=torch.long)
        s_idx = torch.tensor([s for _, s in pairs], dtype=torch.long)
        for store in self.stores:
            for t in store.tensors():
                t[d_idx, :, :end] = t[s_idx, :, :end]
        snapshot = {s: (self.start[s], self.end[s], list(self.tokens[s])) for _, s in pairs}
        for d, s in pairs:
            self.start[d], self.end[d], toks = snapshot[s]
            self.tokens[d] = list(toks)

    def _slide(self, slot: int) -> None:
        """Rebuild a full row from its last ``keep`` tokens (positions restart at 0)."""
        kept = self.tokens[slot][len(self.tokens[slot]) - self.window.keep :]
        T = len(kept)
        if T == 0:  # a context of one token: the new token starts an empty row
            self.start[slot], self.end[slot], self.tokens[slot] = 0, 0, []
            return
        idx = torch.tensor([kept], dtype=torch.long, device=self.model.device)
        self.reserve(T)
        self._run(idx, torch.arange(T, device=self.model.device), None, slice(slot, slot + 1), 0, T)
        self.start[slot], self.end[slot], self.tokens[slot] = 0, T, kept

    def _run(
        self,
        idx: torch.Tensor,
        pos: torch.Tensor,
        mask: torch.Tensor | None,
        rows: Rows,
        write: int | torch.Tensor,
        read_end: int,
        last_only: bool = True,
    ) -> torch.Tensor:
        """One forward pass through the planned cache rows → last-position logits ``(n, vocab)`` float32
        (``last_only=False``: every position's, ``(n, T, vocab)``)."""
        for view in self.layers:
            view.rows, view.write, view.end = rows, write, read_end
        out = self.model.run(idx, pos=pos, cache=self.layers, attn_mask=mask, last_only=last_only)
        logits = logits_of(out).float()
        release_after_pass(idx)
        return logits[:, -1] if last_only else logits


#: From this many query tokens (every row's together) an eager pass on a CPU hands the C heap's free
#: pages back to the system once it is done (``release_after_pass``)
RELEASE_AFTER_TOKENS = 64


def release_after_pass(idx: torch.Tensor) -> bool:
    """After a pass over the tokens ``idx`` on a CPU, from ``RELEASE_AFTER_TOKENS`` of them: the heap's
    free pages go back to the system (glibc's ``malloc_trim``, ``gptlab.hardware.release_memory``)
    → whether they were.

    Within a pass the kept heap (``gptlab.hardware.keep_heap``) reuses each freed block, so the pass
    pays no page faults for its temporaries; afterwards they are free but stayed resident, so a long
    prompt raised what the decode that follows holds: SmolLM2's Q4_0 file, decoding after a 505-token
    prompt, 421–425 MB against 373 MB handed back. The price is the next long pass's first touch of
    its pages (~12,000 faults, about half of them its cache: +3–10 % of a 505-token prefill) and the
    trim itself (3–5 ms; 1–2 ms after a short pass, hence the threshold)."""
    if idx.device.type != "cpu" or idx.numel() < RELEASE_AFTER_TOKENS:
        return False
    return release_memory()


# ------------------------------------------------------------ window
class ContextWarning(UserWarning):
    """A prompt was cut to fit the context, or generation went past it (the window slides) or stopped at it."""


class Session(Protocol):
    """Rows of a KV cache and the passes that fill them (dynamic, static, or the server's two lanes).

    ``step({slot: token})`` appends each token and returns, per slot, the next-token logits (the
    dynamic cache) or the next token already chosen inside the graph (the static cache).
    """

    max_batch: int
    max_len: int

    @property
    def free_slots(self) -> int: ...

    def full(self, slot: int) -> bool: ...

    def window_notice(self) -> str: ...

    def fit(self, ids: Sequence[int]) -> list[int]: ...

    def remove(self, slot: int) -> None: ...

    def step(self, feed: dict[int, int]) -> Mapping[int, torch.Tensor | int]: ...


class Window:
    """A session's size (checked once) and what happens past its context."""

    def __init__(self, model: Decoder, max_batch: int, max_len: int | None) -> None:
        block = int(model.config.block_size)
        max_len = block if max_len is None else max_len
        if not isinstance(max_batch, int) or max_batch < 1:
            raise GptlabError(f"max_batch must be a positive integer, got {max_batch!r}")
        if not isinstance(max_len, int) or not 1 <= max_len <= block:
            raise GptlabError(
                f"max_len must be between 1 and the model's block_size ({block}), got {max_len!r}"
            )
        self.max_batch, self.max_len = max_batch, max_len
        self.vocab_size = int(model.config.vocab_size)
        self.can_slide = not model.positional.absolute_table  # RoPE, ALiBi, none: slide with the cache
        # tokens kept when a full row slides: ¾ of it with relative positions, all but one with absolute ones
        self.keep = max(1, (max_len * 3) // 4) if self.can_slide else max_len - 1

    def notice(self) -> str:
        """What happens past the context, in one sentence (shown once per request)."""
        how = (
            f"the cache is rebuilt from the last {self.keep} tokens whenever it fills"
            if self.can_slide
            else "learned/sinusoidal positions: each new token re-runs the window without a cache"
        )
        return (
            f"the text passed the context of {self.max_len} tokens; generation goes on over a "
            f"sliding window of the last {self.max_len} tokens ({how})"
        )

    def fit(self, ids: Sequence[int]) -> list[int]:
        """``ids`` as a list, cut to its last ``max_len`` tokens (with a ``ContextWarning``)."""
        ids = [int(t) for t in ids]
        if not ids:
            raise GptlabError("the prompt is empty; give at least one token (e.g. <|endoftext|>)")
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise GptlabError(f"token id {bad} is outside the model's vocabulary (0..{self.vocab_size - 1})")
        if len(ids) > self.max_len:
            warnings.warn(
                f"the prompt has {len(ids)} tokens, more than the context of {self.max_len}; "
                f"keeping its last {self.max_len} tokens",
                ContextWarning,
                stacklevel=4,
            )
            ids = ids[-self.max_len :]
        return ids
