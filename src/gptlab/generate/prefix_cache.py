"""A prefix cache: the keys and values of recent token sequences, reused by the next prompt that starts alike.

In a causal decoder the keys and values at positions ``[0, m)`` depend on tokens ``[0, m)`` only, so
a prompt whose first ``m`` tokens were seen before (a shared system prompt, the previous turn of a
chat) can copy them instead of computing them, and prefill only tokens ``[m, n)``:

    lookup(prompt)  → the longest cached run of whole blocks that prefixes it (at most n − 1 tokens:
                      the last token is always run, for its logits)
    store(tokens)   → the blocks of a sequence not cached yet (a prompt after its prefill, a
                      finished request's prompt + generated text when its row is freed)

Storage is block-aligned (vLLM's automatic prefix caching): a sequence is cut into blocks of
``block_tokens`` tokens and block ``j`` is keyed by ``(key of block j − 1, its tokens)``, a chain
from the first token. Two prompts that share their first 600 tokens share those blocks in memory,
and a key names the whole prefix up to its block, never a block's tokens alone. A block holds, for
every tensor of a layer's store (``k, v``, plus the scales of an int8 cache), the slice at its
positions stacked over layers: ``(L, H_kv, block_tokens, d)``, in the session's cache dtype. The
tail of a sequence shorter than a block is not kept.

Positions: a block's keys and values were computed at positions counted from the sequence's first
token (0), the positions a row of a session gives its prompt. They are copied into a row at the
same positions from that row's start, so learned, sinusoidal, RoPE, ALiBi and no positions are all
exact. A row that slid past the context is stored as the window it holds (rebuilt from position
0), keyed by that window's tokens, so no stale key is ever reused.

Budget: ``budget_bytes`` bounds the blocks' tensors. Before a block is added, the least recently
used *leaf* blocks (no cached block continues them) are evicted until it fits; a lookup or store
marks every block of its chain as used. A budget of 0 turns the cache off (every lookup is a miss,
nothing is stored). The cache belongs to one model and one cache layout (dtype, shapes); a session
with another layout neither reads nor writes it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from gptlab.errors import GptlabError

#: tokens per block (vLLM's default): finer reuse costs more keys, coarser wastes up to a block per prompt
BLOCK_TOKENS = 16

Key = tuple[int, tuple[int, ...]]  # (the previous block's id, this block's tokens)
Layout = tuple[tuple[torch.dtype, tuple[int, ...]], ...]  # per stored tensor: dtype, (L, H_kv, d)
#: ``extract(a, b)``: per stored tensor, positions ``[a, b)`` of a row stacked over layers (L, H_kv, b − a, d)
Extract = Callable[[int, int], list[torch.Tensor]]


@dataclass(eq=False)
class Block:
    """``block_tokens`` positions of every layer, after the block ``parent`` (0: the sequence's start)."""

    id: int
    key: Key
    tensors: list[torch.Tensor]
    nbytes: int
    children: int = 0


class PrefixCache:
    """Blocks of keys and values under a byte budget, least recently used evicted first."""

    def __init__(self, budget_bytes: int, block_tokens: int = BLOCK_TOKENS) -> None:
        if budget_bytes < 0:
            raise GptlabError(f"the prefix cache budget must be 0 (off) or more bytes, got {budget_bytes}")
        if block_tokens < 1:
            raise GptlabError(f"block_tokens must be at least 1, got {block_tokens}")
        self.budget_bytes, self.block_tokens = int(budget_bytes), int(block_tokens)
        self._blocks: OrderedDict[Key, Block] = OrderedDict()  # least recently used first
        self._by_id: dict[int, Block] = {}
        self._next_id = 1
        self.layout: Layout | None = None
        self.bytes = 0
        self.hits = self.misses = self.evictions = 0
        self.tokens_reused = self.tokens_looked_up = 0

    @property
    def enabled(self) -> bool:
        return self.budget_bytes > 0

    def __len__(self) -> int:
        """Blocks held."""
        return len(self._blocks)

    def stats(self) -> dict[str, int]:
        """The counters: lookups that reused a prefix (hits) or none (misses), prompt tokens looked
        up and reused, blocks and bytes held, the budget, blocks evicted."""
        return {
            "budget_bytes": self.budget_bytes,
            "bytes": self.bytes,
            "blocks": len(self._blocks),
            "block_tokens": self.block_tokens,
            "hits": self.hits,
            "misses": self.misses,
            "tokens_looked_up": self.tokens_looked_up,
            "tokens_reused": self.tokens_reused,
            "evictions": self.evictions,
        }

    def clear(self) -> None:
        """Forget every block (the counters stay)."""
        self._blocks.clear()
        self._by_id.clear()
        self.bytes = 0

    def accepts(self, layout: Layout) -> bool:
        """Whether blocks of ``layout`` may be read and written (the first layout stored fixes it)."""
        return self.enabled and (self.layout is None or self.layout == layout)

    # ------------------------------------------------------------ reading
    def _chain(self, tokens: Sequence[int], n_blocks: int) -> list[Block]:
        """The cached blocks that prefix ``tokens``, at most ``n_blocks`` of them."""
        chain: list[Block] = []
        parent, B = 0, self.block_tokens
        for j in range(n_blocks):
            block = self._blocks.get((parent, tuple(tokens[j * B : (j + 1) * B])))
            if block is None:
                break
            chain.append(block)
            parent = block.id
        return chain

    def _touch(self, chain: list[Block]) -> None:
        for block in chain:
            self._blocks.move_to_end(block.key)

    def lookup(self, tokens: Sequence[int], layout: Layout) -> tuple[int, list[torch.Tensor]]:
        """The longest cached prefix of ``tokens`` that leaves at least one token to run →
        ``(m, tensors)``: per stored tensor, positions ``[0, m)`` stacked over layers (L, H_kv, m, d);
        ``(0, [])`` on a miss. Counts a hit or a miss."""
        m, blocks = self.lookup_blocks(tokens, layout)
        if len(blocks) == 1:
            return m, list(blocks[0])
        return m, [torch.cat(list(p), dim=2) for p in zip(*blocks, strict=True)]

    def lookup_blocks(self, tokens: Sequence[int], layout: Layout) -> tuple[int, list[list[torch.Tensor]]]:
        """``lookup`` without joining the blocks → ``(m, blocks)``: per block of the prefix, in order, its
        tensors (L, H_kv, block_tokens, d), which a caller copies straight to where they go (one copy of
        the keys and values instead of two)."""
        tokens = list(tokens)
        self.tokens_looked_up += len(tokens)
        chain: list[Block] = []
        if self.accepts(layout):
            chain = self._chain(tokens, (len(tokens) - 1) // self.block_tokens)
        if not chain:
            self.misses += 1
            return 0, []
        self._touch(chain)
        m = len(chain) * self.block_tokens
        self.hits += 1
        self.tokens_reused += m
        return m, [block.tensors for block in chain]

    # ------------------------------------------------------------ writing
    def store(self, tokens: Sequence[int], layout: Layout, extract: Extract) -> int:
        """Add the blocks of ``tokens`` not cached yet (``extract(a, b)`` gives positions ``[a, b)``)
        → blocks added. Stops early when a block cannot fit even after evicting every other leaf."""
        if not self.accepts(layout):
            return 0
        self.layout = layout
        tokens = list(tokens)
        B = self.block_tokens
        n_blocks = len(tokens) // B
        chain = self._chain(tokens, n_blocks)
        self._touch(chain)
        protected = {block.id for block in chain}
        added = 0
        for j in range(len(chain), n_blocks):
            tensors = [t.clone() for t in extract(j * B, (j + 1) * B)]
            nbytes = sum(t.numel() * t.element_size() for t in tensors)
            if not self._make_room(nbytes, protected):
                break
            parent = chain[-1] if chain else None
            block = Block(
                self._next_id,
                (parent.id if parent else 0, tuple(tokens[j * B : (j + 1) * B])),
                tensors,
                nbytes,
            )
            self._next_id += 1
            if parent is not None:
                parent.children += 1
            self._blocks[block.key] = block
            self._by_id[block.id] = block
            self.bytes += nbytes
            chain.append(block)
            protected.add(block.id)
            added += 1
        return added

    def _make_room(self, nbytes: int, protected: set[int]) -> bool:
        """Evict least recently used leaves (none of ``protected``) until ``nbytes`` more fit the budget."""
        if nbytes > self.budget_bytes:
            return False
        while self.bytes + nbytes > self.budget_bytes:
            victim = next(
                (b for b in self._blocks.values() if b.children == 0 and b.id not in protected), None
            )
            if victim is None:
                return False
            self._evict(victim)
        return True

    def _evict(self, block: Block) -> None:
        del self._blocks[block.key]
        del self._by_id[block.id]
        self.bytes -= block.nbytes
        self.evictions += 1
        parent = self._by_id.get(block.key[0])
        if parent is not None:
            parent.children -= 1


def budget_of(megabytes: float) -> int:
    """``--prefix-cache-mb N`` → bytes (N MiB); 0 turns the cache off."""
    if megabytes < 0:
        raise GptlabError(f"--prefix-cache-mb must be 0 (off) or more, got {megabytes}")
    return int(megabytes * 2**20)
