"""``gptlab.evaluate.scoring``: log p(continuation | context) against a plain forward pass, shared contexts,
truncation, rolling windows as lm-eval defines them, and a prompt's own log-probabilities."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import gptlab
from gptlab import GPT
from gptlab.errors import GptlabError
from gptlab.evaluate.scoring import loglikelihoods, prompt_logprobs, rolling_loglikelihood, rolling_windows

VOCAB, BLOCK = 50, 32


@pytest.fixture(scope="module", params=["rope", "learned"])
def model(request, tiny_model) -> GPT:
    return tiny_model(vocab_size=VOCAB, block_size=BLOCK, pos=request.param)


def reference(model: GPT, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """One unbatched forward pass over (x ⧺ y) cut to its last block + 1 tokens."""
    full = (context + continuation)[-(BLOCK + 1) :]
    start = len(full) - len(continuation)
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([full[:-1]]))[0].float(), dim=-1)
    rows = logp[start - 1 : start - 1 + len(continuation)]
    target = torch.tensor(continuation)
    return float(rows.gather(-1, target[:, None]).sum()), bool((rows.argmax(-1) == target).all())


def requests(seed: int) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(seed)

    def ids(lo: int, hi: int) -> list[int]:
        return torch.randint(0, VOCAB, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()

    out = []
    for _ in range(6):  # contexts with several continuations each (multiple choice)
        ctx = ids(1, 20)
        out += [(ctx, ids(1, 6)) for _ in range(4)]
    out += [(ids(1, 25), ids(1, 8)) for _ in range(7)]  # contexts of their own
    out.append((ids(40, 50), ids(3, 5)))  # longer than the window: the context loses its oldest tokens
    return out


@pytest.mark.parametrize("batch_tokens", [1, 60, 4096])  # a context per batch, several, all in one
def test_loglikelihoods_equal_one_forward_pass_each(model, batch_tokens):
    reqs = requests(1)
    got = loglikelihoods(model, reqs, batch_tokens=batch_tokens)
    assert len(got) == len(reqs)
    for (ctx, cont), score in zip(reqs, got, strict=True):
        logprob, greedy = reference(model, ctx, cont)
        assert score.logprob == pytest.approx(logprob, abs=1e-4)
        assert score.greedy == greedy
        assert len(score.token_logprobs) == len(cont)
        assert sum(score.token_logprobs) == pytest.approx(score.logprob, abs=1e-5)


def test_greedy_continuation_is_recognised(model):
    ctx = [3, 4, 5]
    with torch.no_grad():
        out = gptlab.generate_ids(model, torch.tensor([ctx]), 4, temperature=0)[0, 3:].tolist()
    assert loglikelihoods(model, [(ctx, out)])[0].greedy
    wrong = [(out[0] + 1) % VOCAB, *out[1:]]
    assert not loglikelihoods(model, [(ctx, wrong)])[0].greedy


def test_shared_context_runs_once(model, monkeypatch):
    """Four choices of one context, and two other contexts: the contexts' forward pass (each once,
    left-padded), then one batch of every continuation."""
    calls = []
    run = model.run

    def counted(idx, *args, **kwargs):
        calls.append(tuple(idx.shape))
        return run(idx, *args, **kwargs)

    monkeypatch.setattr(model, "run", counted)
    ctx = list(range(10))
    loglikelihoods(model, [(ctx, [1, 2]), (ctx, [3]), ([5, 6], [4, 5, 6]), (ctx, [7, 8]), ([1], [2])])
    assert calls == [(3, 10), (5, 2)]


def test_bad_requests_are_one_error(model):
    with pytest.raises(GptlabError, match="continuation to score is empty"):
        loglikelihoods(model, [([1], [])])
    with pytest.raises(GptlabError, match="context to score against is empty"):
        loglikelihoods(model, [([], [1])])
    with pytest.raises(GptlabError, match="does not fit"):
        loglikelihoods(model, [([1], [2] * (BLOCK + 1))])


@pytest.mark.parametrize("n", [0, 1, 5, 31, 32, 33, 64, 100])
@pytest.mark.parametrize("max_len", [1, 2, 7, 32])
def test_rolling_windows_are_lm_evals(n, max_len):
    utils = pytest.importorskip("lm_eval.utils", reason="lm-eval (the eval extra) is not installed")
    tokens = list(range(100, 100 + n))
    expected = [utils.make_disjoint_window(w) for w in utils.get_rolling_token_windows(tokens, 7, max_len, 1)]
    assert rolling_windows(tokens, 7, max_len) == [(list(a), list(b)) for a, b in expected]


def test_rolling_windows_cover_every_token_once():
    windows = rolling_windows(list(range(10, 33)), 0, 5)
    assert [t for _, cont in windows for t in cont] == list(range(10, 33))
    assert windows[0][0] == [0]


def test_rolling_loglikelihood_within_the_window_is_one_pass(model):
    tokens = [5, 9, 2, 7, 1, 3]
    logprob, _ = reference(model, [0], tokens)
    assert rolling_loglikelihood(model, tokens, 0) == pytest.approx(logprob, abs=1e-4)


def test_prompt_logprobs(model):
    ids = [4, 8, 15, 16, 23, 42]
    scores = prompt_logprobs(model, ids, top_n=3)
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([ids]))[0].float(), dim=-1)
    expected = [float(logp[t - 1, ids[t]]) for t in range(1, len(ids))]
    assert scores.token_logprobs == pytest.approx(expected, abs=1e-5)
    for t, top in enumerate(scores.top):
        assert [i for i, _ in top] == logp[t].topk(3).indices.tolist()
    assert prompt_logprobs(model, [4]).token_logprobs == []
