"""Scoring text: the log-likelihood of a continuation given its context, and of a prompt's own tokens.

    log p(y | x) = Σ_{t=1..m} log softmax(l_{n+t-1})_{y_t}     x = x_1..x_n (context), y = y_1..y_m
    greedy(y | x) = ∀t: y_t = argmax_v l_{n+t-1, v}            (y is what greedy decoding would write)

where ``l_i`` are the logits at position ``i`` of the single sequence ``x ⧺ y`` (teacher forcing:
one forward pass scores every token of ``y``). This is lm-evaluation-harness's ``loglikelihood``.

Requests that share a context share its forward pass. A batch is two forward passes: the distinct
contexts, left-padded (padding hidden by the mask, positions counted from each context's first token),
whose keys/values are kept (one ``KVView`` per layer); then every continuation of every context as one row,
``y_1..y_{m-1}``, right-padded, attending to its own context's keys and causally to itself. Contexts are
sorted longest first (length-aware batching: little padding) and batched up to ``batch_tokens``
positions.

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

from gptlab.errors import GptlabError
from gptlab.generate.plan import logits_of
from gptlab.model import GPT
from gptlab.model.kvcache import KVStore, KVView

BATCH_TOKENS = 4096  # positions per forward pass (rows × padded length) for unshared contexts


@dataclass(frozen=True)
class Score:
    """``log p(y | x)`` summed, whether ``y`` is the greedy continuation, and each token's log p."""

    logprob: float
    greedy: bool
    token_logprobs: tuple[float, ...]


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


Group = tuple[list[int], list[list[int]]]  # a context and the continuations scored against it


def _batch(model: GPT, groups: list[Group]) -> list[list[Score]]:
    """Several contexts in one pass (left-padded, their keys/values kept), then every continuation of
    every context in a second pass over them (right-padded): two forward passes for the whole batch.

    Context ``g`` of ``n_g`` tokens sits at the right of ``L = max n_g`` columns; its positions are
    ``0..n_g-1`` and its padding is hidden from every real query. A continuation row of group ``g``
    sees the ``n_g`` real keys of its context and its own earlier tokens (causal), at positions ``n_g…``.
    """
    device = model.device
    lengths = torch.tensor([len(ctx) for ctx, _ in groups], device=device)
    width = int(lengths.max())
    cols = torch.arange(width, device=device)
    pad = width - lengths  # (G,)
    valid = cols[None, :] >= pad[:, None]  # (G, L): real context keys
    ids = torch.zeros(len(groups), width, dtype=torch.long, device=device)
    for g, (ctx, _) in enumerate(groups):
        ids[g, width - len(ctx) :] = torch.tensor(ctx, device=device)
    causal = torch.ones(width, width, dtype=torch.bool, device=device).tril()
    eye = torch.eye(width, dtype=torch.bool, device=device)  # a padding query sees itself: no empty row
    mask = (causal[None] & valid[:, None, :]) | eye[None]  # (G, L, L)
    # each layer: the contexts' keys/values stored at [0, L); this pass attends over its own keys
    config = model.config
    shape = (len(groups), config.n_kv_head or config.n_head, width, config.head_dim)  # (G, H_kv, L, d_k)
    cache = [KVView(KVStore.allocate(shape, model.dtype, device), write=0) for _ in range(config.n_layer)]
    pos = (cols[None, :] - pad[:, None]).clamp(min=0)
    first = logits_of(
        model.run(ids, pos=pos, cache=cache, attn_mask=mask[:, None], last_only=True)
    )  # (G, 1, V)

    rows = [(g, cont) for g, (_, conts) in enumerate(groups) for cont in conts]
    owner = torch.tensor([g for g, _ in rows], device=device)
    logits = first[owner]  # (R, 1, V): predicts each continuation's first token
    longest = max(len(cont) for _, cont in rows)
    if longest > 1:
        steps = longest - 1
        new = torch.zeros(len(rows), steps, dtype=torch.long, device=device)
        for r, (_, cont) in enumerate(rows):
            new[r, : len(cont) - 1] = torch.tensor(cont[:-1], device=device)
        for view in cache:  # row r reads its context's keys, then attends over its own (not stored)
            view.rows, view.write, view.end = owner, None, width
        new_pos = lengths[owner][:, None] + torch.arange(steps, device=device)[None, :]
        new_pos = new_pos.clamp(max=model.config.block_size - 1)  # only a padding column can pass the end
        seen = valid[owner][:, None, :].expand(-1, steps, -1)  # (R, M, L)
        own = torch.ones(steps, steps, dtype=torch.bool, device=device).tril()[None].expand(len(rows), -1, -1)
        rest_mask = torch.cat([seen, own], dim=2)[:, None]  # (R, 1, M, L + M)
        rest = logits_of(model.run(new, pos=new_pos, cache=cache, attn_mask=rest_mask))  # (R, M, V)
        logits = torch.cat([logits, rest], dim=1)
    scores = iter(_score_rows(logits, [cont for _, cont in rows]))
    return [[next(scores) for _ in conts] for _, conts in groups]


@torch.inference_mode()
def loglikelihoods(
    model: GPT,
    requests: Sequence[tuple[Sequence[int], Sequence[int]]],
    *,
    batch_tokens: int = BATCH_TOKENS,
    max_len: int | None = None,
) -> list[Score]:
    """``log p(continuation | context)`` and greediness for each ``(context ids, continuation ids)``.

    Results come back in the order of ``requests``. Contexts shared by several requests run once.
    ``max_len`` (default and at most: the model's context) is the longest input: ``max_len + 1`` tokens
    of ``x ⧺ y`` are kept. A batch holds contexts of similar lengths (longest first), as many as fit in
    ``batch_tokens`` positions counted over both passes.
    """
    if batch_tokens < 1:
        raise GptlabError(f"batch_tokens must be at least 1, got {batch_tokens}")
    block = min(max_len or model.config.block_size, model.config.block_size)
    fitted = [_fit(ctx, cont, block) for ctx, cont in requests]
    members: dict[tuple[int, ...], list[int]] = {}
    for i, (ctx, _) in enumerate(fitted):
        members.setdefault(tuple(ctx), []).append(i)
    order = sorted(members, key=lambda ctx: -len(ctx))  # length-aware: little padding per batch
    results: list[Score | None] = [None] * len(fitted)
    start = 0
    while start < len(order):
        width, steps, rows, stop = len(order[start]), 0, 0, start
        while stop < len(order):  # grow the batch while both passes fit in batch_tokens positions
            conts = [len(fitted[i][1]) for i in members[order[stop]]]
            grown_steps, grown_rows = max(steps, max(conts) - 1), rows + len(conts)
            if (
                stop > start
                and (stop - start + 1) * width + grown_rows * (width + grown_steps) > batch_tokens
            ):
                break
            steps, rows, stop = grown_steps, grown_rows, stop + 1
        chunk = order[start:stop]
        groups = [(list(key), [fitted[i][1] for i in members[key]]) for key in chunk]
        for key, scores in zip(chunk, _batch(model, groups), strict=True):
            for i, score in zip(members[key], scores, strict=True):
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
    model: GPT, tokens: Sequence[int], prefix_token: int, max_len: int | None = None
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
def prompt_logprobs(model: GPT, ids: Sequence[int], top_n: int = 0) -> PromptScores:
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
    logits = logits_of(model.run(torch.tensor([ids[:-1]], device=model.device)))[0]  # (n-1, V)
    logp = F.log_softmax(logits.float(), dim=-1)
    picked = logp.gather(-1, torch.tensor(ids[1:], device=logp.device)[:, None])[:, 0].tolist()
    top: list[list[tuple[int, float]]] = [[] for _ in picked]
    if top_n > 0:
        values, indices = logp.topk(min(top_n, logp.size(-1)), dim=-1)
        top = [list(zip(i.tolist(), v.tolist(), strict=True)) for i, v in zip(indices, values, strict=True)]
    return PromptScores(picked, top)
