"""Learning BPE merges: repeatedly merge the most frequent adjacent pair of tokens.

The textbook algorithm (Sennrich et al. 2016; the blueprint's "learned merge
operations" M) on the bytes of each regex chunk:

    repeat V - 256 - |specials| times:
        (a, b) = the most frequent adjacent pair over all chunks
        new token z = a ++ b;  replace every (a, b) by z

Recounting every pair after every merge costs O(corpus) per merge. This module
does the same work incrementally, which gives identical merges:

- each distinct chunk is stored once, with its frequency (``count_chunks``);
- pair counts are kept up to date: only the chunks that contain the merged
  pair change, and in them only the pairs touching a replaced occurrence;
- ``where[pair]`` indexes the chunks that (may) contain ``pair``;
- a max-heap of ``(-count, a, b)`` finds the best pair (``PairStats``); counts of old pairs only
  ever fall, so stale heap entries are fixed lazily when popped.

Tie rule (deterministic): the highest count wins; among equal counts the pair
with the smallest left id wins, then the smallest right id. A pair whose
concatenation is already a token is never merged, so every token has distinct
bytes as tiktoken's rank tables require (a safeguard: with all occurrences of a
pair merged at once it has not been seen to trigger).

    >>> merges, vocab = train_merges({"aaab": 1, "ab": 3}, 2)
    >>> merges, vocab[256:]
    ([(97, 98), (97, 97)], [b'ab', b'aa'])
"""

from __future__ import annotations

import heapq
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence

from tqdm import tqdm

from gptlab.errors import GptlabError
from gptlab.tokenizers.base import check_text
from gptlab.tokenizers.patterns import compile_pattern

Pair = tuple[int, int]


def count_chunks(
    corpus: str | Iterable[str],
    pattern: str = "gpt4",
    special_tokens: Sequence[str] = (),
    progress: bool = False,
) -> Counter[str]:
    """Split every document into chunks and count each distinct chunk once.

    Special-token strings are cut out first, so no merge ever spans them.
    ``progress`` shows a bar with characters split per second.

    >>> count_chunks("the cat the", "gpt2")
    Counter({'the': 1, ' cat': 1, ' the': 1})
    """
    regex = compile_pattern(pattern)
    splitter = None
    if special_tokens:
        alternatives = sorted(set(special_tokens), key=lambda s: (-len(s), s))
        splitter = re.compile("|".join(map(re.escape, alternatives)))
    counts: Counter[str] = Counter()
    with _bar(progress, unit="char", unit_scale=True, desc="split") as bar:
        for doc in [corpus] if isinstance(corpus, str) else corpus:
            check_text(doc)
            for part in splitter.split(doc) if splitter else (doc,):
                counts.update(regex.findall(part))
            bar.update(len(doc))
    return counts


def _bar(progress: bool, **kwargs) -> tqdm:
    """A progress bar on stderr that appears only if the work lasts over half a second."""
    return tqdm(disable=not progress, delay=0.5, mininterval=0.25, **kwargs)


def _merge_word(
    word: list[int], a: int, b: int, z: int, freq: int, counts: dict[Pair, int]
) -> tuple[list[int], list[int]]:
    """Replace each ``(a, b)`` in ``word``, left to right, by ``z``; update ``counts`` of old pairs.

    The pairs that overlapped a replaced ``(a, b)`` lose ``freq`` (each once, even
    when occurrences touch, as in ``a b a b``); ``(a, b)`` itself is left to the
    caller. Returns the new word and the positions of ``z`` in it.

    >>> counts = {(1, 2): 2, (2, 1): 1, (0, 1): 1}
    >>> _merge_word([0, 1, 2, 1, 2], 1, 2, 9, 1, counts), counts
    (([0, 9, 9], [1, 2]), {(1, 2): 2, (2, 1): 0, (0, 1): 0})
    """
    new: list[int] = []
    where_z: list[int] = []
    n = len(word)
    i = 0  # word[i:] is not yet copied
    end = -1  # index just after the previous replaced occurrence
    find = word.index
    while True:
        try:
            j = find(a, i)
        except ValueError:
            break
        if j + 1 < n and word[j + 1] == b:
            new += word[i:j]
            if j > 0 and j != end:  # the left pair, unless the previous occurrence already owned it
                counts[(word[j - 1], a)] -= freq
            if j + 2 < n:
                counts[(b, word[j + 2])] -= freq
            where_z.append(len(new))
            new.append(z)
            i = end = j + 2
        else:
            new += word[i : j + 1]
            i = j + 1
    new += word[i:]
    return new, where_z


class PairStats:
    """Adjacent-pair counts over distinct chunks, kept up to date as pairs are merged.

    ``counts[pair]`` is the pair's frequency, ``where[pair]`` the chunks that may
    hold it, and ``heap`` holds ``(-count, a, b)`` entries, some stale.

    >>> stats = PairStats([[1, 2, 1, 2], [2, 1]], [1, 5])
    >>> stats.pop_best()
    (2, 1)
    >>> stats.merge((2, 1), 9); stats.words, stats.pop_best()
    ([[1, 9, 2], [9]], (1, 9))
    """

    def __init__(self, words: list[list[int]], freqs: list[int]) -> None:
        self.words, self.freqs = words, freqs
        self.counts: defaultdict[Pair, int] = defaultdict(int)
        self.where: defaultdict[Pair, set[int]] = defaultdict(set)
        for i, (word, freq) in enumerate(zip(words, freqs)):
            for pair in zip(word, word[1:]):
                self.counts[pair] += freq
                self.where[pair].add(i)
        self.heap = [(-c, a, b) for (a, b), c in self.counts.items()]
        heapq.heapify(self.heap)

    def pop_best(self) -> Pair | None:
        """Remove and return the most frequent pair (tie rule in the module doc), or None."""
        heap, counts = self.heap, self.counts
        while heap:
            neg, a, b = heapq.heappop(heap)
            count = counts.get((a, b), 0)
            if count == -neg:
                return (a, b)
            if count > 0:  # stale: the count has fallen since this entry was pushed
                heapq.heappush(heap, (-count, a, b))
        return None

    def merge(self, pair: Pair, z: int) -> None:
        """Replace ``pair`` by the new id ``z`` in every chunk; update counts, index and heap."""
        a, b = pair
        words, freqs, counts, where = self.words, self.freqs, self.counts, self.where
        born: set[Pair] = set()  # pairs that contain z
        for i in where.pop(pair, ()):
            word = words[i]
            if a not in word or b not in word:  # a stale index entry (cheap check)
                continue
            freq = freqs[i]
            new, where_z = _merge_word(word, a, b, z, freq, counts)
            if not where_z:  # the index was stale: the pair left this chunk earlier
                continue
            last = len(new) - 1
            for k in where_z:  # the new pairs: (left, z) and (z, right), (z, z) counted once
                if k > 0:
                    p = (new[k - 1], z)
                    counts[p] += freq
                    where[p].add(i)
                    born.add(p)
                if k < last and new[k + 1] != z:
                    p = (z, new[k + 1])
                    counts[p] += freq
                    where[p].add(i)
                    born.add(p)
            words[i] = new
        counts.pop(pair, None)
        for p in born:
            heapq.heappush(self.heap, (-counts[p], p[0], p[1]))


def train_merges(
    chunk_counts: Mapping[str, int] | Mapping[bytes, int],
    num_merges: int,
    progress: bool = False,
) -> tuple[list[Pair], list[bytes]]:
    """Learn up to ``num_merges`` merges from ``{chunk: frequency}``.

    Returns ``(merges, vocab)``: merge ``i`` is the pair of ids that became id
    ``256 + i``, and ``vocab[id]`` is the bytes of every id. Training stops
    early when no adjacent pair is left.
    """
    words: list[list[int]] = []
    freqs: list[int] = []
    for chunk, freq in chunk_counts.items():
        data = chunk.encode("utf-8") if isinstance(chunk, str) else chunk
        if len(data) > 1 and freq > 0:
            words.append(list(data))
            freqs.append(freq)
    stats = PairStats(words, freqs)
    vocab = [bytes([i]) for i in range(256)]
    known = set(vocab)
    merges: list[Pair] = []
    with _bar(progress, total=num_merges, unit="merge", desc="bpe") as bar:
        while len(merges) < num_merges:
            pair = stats.pop_best()
            if pair is None:
                break
            token = vocab[pair[0]] + vocab[pair[1]]
            if token in known:  # the same bytes are already a token: never merge this pair
                continue
            stats.merge(pair, len(vocab))
            vocab.append(token)
            known.add(token)
            merges.append(pair)
            bar.update(1)
    return merges, vocab


def check_vocab_size(vocab_size: int, n_special: int) -> int:
    """The number of merges for ``vocab_size`` (256 bytes and the specials come first)."""
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise GptlabError(f"vocab_size must be an int, got {vocab_size!r}")
    floor = 256 + n_special
    if vocab_size < floor:
        raise GptlabError(
            f"vocab_size {vocab_size} is too small: byte-level BPE needs 256 byte tokens + {n_special} "
            f"special token(s) = {floor}; use vocab_size >= {floor}"
        )
    return vocab_size - floor
