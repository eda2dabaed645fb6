"""The generated tokens' ``logprobs`` are the model's raw distribution, ``log softmax(l)``, whatever the sampling
settings (OpenAI's meaning; lm-eval reads them): temperature, penalties, ``logit_bias`` and truncation choose
the token, they do not change its reported log-probability. Checked against a plain forward pass in float32,
batched (``n`` > 1 and several prompts) and streamed, and against the echo of the same tokens."""

from __future__ import annotations

import json

import pytest
import torch

from gptlab.generate import SampleConfig
from gptlab.generate.request import token_text
from gptlab.generate.sampling import Sampler
from tests.serve._serving import raw_logprobs

SAMPLING = {"temperature": 0.7, "repetition_penalty": 1.8, "top_k": 6, "seed": 11}
TOP = 3


def ids_of(tok, texts: list[str]) -> list[int]:
    by_text = {token_text(tok, i): i for i in range(tok.vocab_size)}
    return [by_text[t] for t in texts]


def check_choice(model, tok, prompt: list[int], logprobs: dict) -> float:
    """Each generated token's log p and top alternatives = the plain forward pass's; returns the largest
    gap between that raw log p and the log p under the processed (sampling) distribution."""
    generated = ids_of(tok, logprobs["tokens"])
    assert generated, "nothing generated"
    sampler = Sampler(SampleConfig(max_new_tokens=1, **SAMPLING), tok.vocab_size)
    gap = 0.0
    for j, token in enumerate(generated):
        context = prompt + generated[:j]
        logp = raw_logprobs(model, context)[-1]
        assert logprobs["token_logprobs"][j] == pytest.approx(float(logp[token]), abs=1e-5)
        best = logp.topk(TOP)
        assert logprobs["top_logprobs"][j] == pytest.approx(
            {token_text(tok, i): v for i, v in zip(best.indices.tolist(), best.values.tolist(), strict=True)},
            abs=1e-5,
        )
        with torch.no_grad():
            logits = model(torch.tensor([context]))[0, -1].float()
        processed = torch.log_softmax(sampler.process(logits, context), dim=-1)
        gap = max(gap, abs(float(processed[token]) - float(logp[token])))
    return gap


@pytest.mark.parametrize("stream", [False, True])
def test_completion_logprobs_are_the_raw_distribution(client, model, tok, stream):
    prompts = [tok.encode("to be or not"), tok.encode("the cat sat")]
    body = {"prompt": prompts, "max_tokens": 6, "n": 2, "logprobs": TOP, **SAMPLING}
    if stream:
        per_choice: dict[int, dict] = {}
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                piece = json.loads(line[6:])["choices"][0]
                if piece["logprobs"]:
                    got = per_choice.setdefault(
                        piece["index"], {"tokens": [], "token_logprobs": [], "top_logprobs": []}
                    )
                    for key in got:
                        got[key] += piece["logprobs"][key]
        choices = [{"index": i, "logprobs": lp} for i, lp in sorted(per_choice.items())]
    else:
        choices = client.post("/v1/completions", json=body).json()["choices"]
    assert len(choices) == 4
    gaps = [check_choice(model, tok, prompts[c["index"] // 2], c["logprobs"]) for c in choices]
    assert max(gaps) > 1e-2  # the sampling distribution differs: reporting it would fail the checks above


def test_a_generated_token_sent_back_has_the_same_logprob_as_its_echo(client, tok):
    prompt = tok.encode("to be or not")
    made = client.post(
        "/v1/completions", json={"prompt": [prompt], "max_tokens": 5, "logprobs": 1, **SAMPLING}
    ).json()["choices"][0]["logprobs"]
    generated = ids_of(tok, made["tokens"])
    echo = client.post(
        "/v1/completions",
        json={"prompt": [prompt + generated], "max_tokens": 0, "logprobs": 1, "echo": True},
    ).json()["choices"][0]["logprobs"]
    assert echo["token_logprobs"][len(prompt) :] == pytest.approx(made["token_logprobs"], abs=1e-5)
