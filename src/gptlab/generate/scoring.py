"""Scoring text: the log-likelihood of a continuation given its context, and of a prompt's own tokens.

    log p(y | x) = Σ_{t=1..m} log softmax(l_{n+t-1})_{y_t}     x = x_1..x_n (context), y = y_1..y_m
    greedy(y | x) = ∀t: y_t = argmax_v l_{n+t-1, v}            (y is what greedy decoding would write)

where ``l_i`` are the logits at position ``i`` of the single sequence ``x ⧺ y`` (teacher forcing:
one forward pass scores every token of ``y``). This is lm-evaluation-harness's ``loglikelihood``.

Requests that share a context share its forward pass: the context is run once and its keys/values
are kept (``_PrefixCache``); then every continuation of that context runs as one row of a batch over
that cache, ``y_1..y_{m-1}``, right-padded (causal attention: padding after a token never changes it).
Requests with a context of their own are batched together, longest first (length-aware batching:
rows of similar lengths, little padding), up to ``batch_tokens`` positions per forward pass.

A sequence longer than the context window keeps its last ``block_size + 1`` tokens, as lm-eval's
Hugging Face backend does (the continuation is kept whole; the context loses its oldest tokens).

The rolling variant scores a whole text longer than the window, as lm-eval's ``loglikelihood_rolling``
defines it (``lm_eval.utils.get_rolling_token_windows`` with ``context_len = 1``, then
``make_disjoint_window``): a prefix token, then disjoint windows of at most ``max_len`` predicted tokens,
each conditioned on the ``max_len`` tokens before it:

    log p(text) = Σ_windows log p(window | the tokens before it, at most max_len of them)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from gptlab.errors import GptlabError

BATCH_TOKENS = 4096  # positions per forward pass (rows × padded length) for unshared contexts


@dataclass(frozen=True)
class Score:
    """``log p(y | x)`` summed, whether ``y`` is the greedy continuation, and each token's log p."""

    logprob: float
    greedy: bool
    token_logprobs: tuple[float, ...]


class _PrefixLayer:
    """One layer's keys/values of the shared context, then ``[K_context; k_new]`` for each row."""

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None  # (1, H_kv, n, d_k)
        self.v: torch.Tensor | None = None

    def update(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.k is None or self.v is None:  # the context's own forward pass records it
            self.k, self.v = k, v
            return k, v
        rows = k.size(0)
        return (
            torch.cat([self.k.expand(rows, -1, -1, -1), k], dim=2),
            torch.cat([self.v.expand(rows, -1, -1, -1), v], dim=2),
        )


class _PrefixCache:
    """What ``GPT.run`` calls ``cache``: per-layer ``update`` and the number of cached positions."""

    def __init__(self, n_layer: int) -> None:
        self.layers = [_PrefixLayer() for _ in range(n_layer)]
        self.length = 0


def _fit(context: Sequence[int], continuation: Sequence[int], block: int) -> tuple[list[int], list[int]]:
    """``(context, continuation)`` checked, the context cut from the left to fit ``block + 1`` tokens."""
    ctx, cont = [int(t) for t in context], [int(t) for t in continuation]
    if not cont:
        raise GptlabError("a continuation to score is empty; give at least one token")
    if len(cont) > block:
        raise GptlabError(
            f"a continuation of {len(cont)} tokens does not fit the model's context of {block} tokens"
        )
    ctx = ctx[max(0, len(ctx) + len(cont) - (block + 1)) :]
    if not ctx:
        raise GptlabError("a context to score against is empty; give at least one token (e.g. BOS or EOS)")
    return ctx, cont


def _score_rows(logits: torch.Tensor, targets: Sequence[Sequence[int]]) -> list[Score]:
    """Row ``r`` of ``logits`` (R, T, V): positions ``0..m_r-1`` predict ``targets[r]`` (length m_r)."""
    logp = F.log_softmax(logits.float(), dim=-1)  # (R, T, V)
    best = logp.argmax(dim=-1)  # (R, T)
    out = []
    for r, target in enumerate(targets):
        ids = torch.tensor(target, device=logp.device)
        picked = logp[r, : len(target)].gather(-1, ids[:, None])[:, 0]
        greedy = bool((best[r, : len(target)] == ids).all())
        values = tuple(picked.tolist())
        out.append(Score(float(sum(values)), greedy, values))
    return out


def _padded(rows: Sequence[Sequence[int]], device: torch.device) -> torch.Tensor:
    """Right-padded ``(R, max len)`` ids (the padding id is 0: causal attention never looks ahead)."""
    width = max(len(r) for r in rows)
    return torch.tensor([list(r) + [0] * (width - len(r)) for r in rows], dtype=torch.long, device=device)


def _shared(model: nn.Module, context: list[int], continuations: list[list[int]]) -> list[Score]:
    """One context's continuations: the context once (its keys/values kept), then every row over it."""
    device = model.device
    cache = _PrefixCache(model.config.n_layer)
    first = model.run(torch.tensor([context], device=device), cache=cache, last_only=True).logits  # (1,1,V)
    cache.length = len(context)
    longest = max(len(c) for c in continuations)
    rest = None
    if longest > 1:
        rows = [c[:-1] or [0] for c in continuations]  # y_1..y_{m-1}: the inputs that predict y_2..y_m
        rest = model.run(_padded(rows, device), cache=cache).logits  # (R, longest-1, V)
    logits = first.expand(len(continuations), -1, -1)
    if rest is not None:
        logits = torch.cat([logits, rest], dim=1)
    return _score_rows(logits, continuations)


def _alone(model: nn.Module, pairs: list[tuple[list[int], list[int]]]) -> list[Score]:
    """Pairs with contexts of their own, in one batch: row ``x ⧺ y_1..y_{m-1}``, logits of the last m."""
    rows = [(ctx + cont)[:-1] for ctx, cont in pairs]
    logits = model.run(_padded(rows, model.device)).logits  # (R, T, V)
    width = max(len(cont) for _, cont in pairs)
    picked = torch.stack(
        [
            F.pad(logits[r, len(ctx) - 1 : len(ctx) - 1 + len(cont)], (0, 0, 0, width - len(cont)))
            for r, (ctx, cont) in enumerate(pairs)
        ]
    )
    return _score_rows(picked, [cont for _, cont in pairs])


@torch.inference_mode()
def loglikelihoods(
    model: nn.Module,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    batch_tokens: int = BATCH_TOKENS,
    max_len: int | None = None,
) -> list[Score]:
    """``log p(continuation | context)`` and greediness for each ``(context ids, continuation ids)``.

    Results come back in the order of ``requests``. Contexts shared by several requests run once.
    ``max_len`` (default and at most: the model's context) is the longest input: ``max_len + 1`` tokens
    of ``x ⧺ y`` are kept.
    """
    if batch_tokens < 1:
        raise GptlabError(f"batch_tokens must be at least 1, got {batch_tokens}")
    block = min(max_len or model.config.block_size, model.config.block_size)
    fitted = [_fit(ctx, cont, block) for ctx, cont in requests]
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, (ctx, _) in enumerate(fitted):
        groups.setdefault(tuple(ctx), []).append(i)
    results: list[Score | None] = [None] * len(fitted)
    singles = []
    for ctx, members in groups.items():
        if len(members) == 1:
            singles.append(members[0])
            continue
        scores = _shared(model, list(ctx), [fitted[i][1] for i in members])
        for i, score in zip(members, scores, strict=True):
            results[i] = score
    singles.sort(key=lambda i: -(len(fitted[i][0]) + len(fitted[i][1])))  # longest first
    start = 0
    while start < len(singles):
        width = len(fitted[singles[start]][0]) + len(fitted[singles[start]][1]) - 1
        stop = start + max(1, batch_tokens // max(width, 1))
        chunk = singles[start:stop]
        for i, score in zip(chunk, _alone(model, [fitted[i] for i in chunk]), strict=True):
            results[i] = score
        start = stop
    return [r for r in results if r is not None]


def rolling_windows(
    tokens: Sequence[int], prefix_token: int, max_len: int
) -> list[tuple[list[int], list[int]]]:
    """Disjoint ``(context, continuation)`` windows covering ``tokens``, as lm-eval's rolling loglikelihood.

    The first window predicts ``tokens[:max_len]`` from ``[prefix_token] ⧺ tokens[:max_len-1]``; each
    next one predicts the following ``max_len`` tokens (fewer at the end) from the ``max_len`` tokens
    before them. >>> rolling_windows([5, 6, 7, 8, 9], 0, 2) → [([0], [5, 6]), ([5], [7, 8]), ([7], [9])]
    (contexts shown without the overlap that ``make_disjoint_window`` removes).
    """
    if max_len < 1:
        raise GptlabError(f"max_len must be at least 1, got {max_len}")
    tokens = [int(t) for t in tokens]
    if not tokens:
        return []
    first = min(max_len, len(tokens))
    windows = [([prefix_token, *tokens[: first - 1]], tokens[:first])]
    predicted = first
    while predicted < len(tokens):
        n = min(len(tokens) - predicted, max_len)
        end = predicted + n
        windows.append((tokens[max(0, end - max_len - 1) : end - 1], tokens[end - n : end]))
        predicted = end
    # make_disjoint_window: the context keeps only what comes before the continuation
    return [(ctx[: len(ctx) - (len(cont) - 1)], cont) for ctx, cont in windows]


def rolling_loglikelihood(
    model: nn.Module, tokens: Sequence[int], prefix_token: int, max_len: int | None = None
) -> float:
    """``log p(tokens)`` over disjoint windows of at most ``max_len`` (default: the model's context)."""
    windows = rolling_windows(tokens, prefix_token, max_len or model.config.block_size)
    return sum(s.logprob for s in loglikelihoods(model, windows))


@dataclass(frozen=True)
class PromptScores:
    """Per prompt token ``t ≥ 1``: ``log p(x_t | x_<t)``, and the top alternatives ``[(id, log p)]``."""

    token_logprobs: list[float]
    top: list[list[tuple[int, float]]]


@torch.inference_mode()
def prompt_logprobs(model: nn.Module, ids: Sequence[int], top_n: int = 0) -> PromptScores:
    """``log softmax(l_{t-1})_{x_t}`` for ``t = 1..n-1`` of ``ids`` (the first token has no prediction).

    From the raw distribution of the model (no temperature, penalties or truncation): the echo of an
    OpenAI completions request with ``logprobs``, which lm-eval's ``local-completions`` scores with.
    """
    ids = [int(t) for t in ids]
    if len(ids) > model.config.block_size:
        raise GptlabError(
            f"a prompt of {len(ids)} tokens is longer than the model's context of {model.config.block_size}"
        )
    if len(ids) < 2:
        return PromptScores([], [])
    logits = model.run(torch.tensor([ids[:-1]], device=model.device)).logits[0]  # (n-1, V)
    logp = F.log_softmax(logits.float(), dim=-1)
    picked = logp.gather(-1, torch.tensor(ids[1:], device=logp.device)[:, None])[:, 0].tolist()
    top: list[list[tuple[int, float]]] = [[] for _ in picked]
    if top_n > 0:
        values, indices = logp.topk(min(top_n, logp.size(-1)), dim=-1)
        top = [list(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(indices, values, strict=True)]
    return PromptScores(picked, top)
