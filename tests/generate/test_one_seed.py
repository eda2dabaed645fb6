"""One seed, one text: every engine draws the same tokens for the same seed (one sampler, ``sampling.py``).

The reference is the plainest engine: one row at a time on the dynamic cache, layer by layer. Each
other engine the CPU runs (a batch on the dynamic cache, the static cache eagerly and traced by
``torch.compile``, and, in the slow test, inductor's frozen batch step and the fused one-row step)
must give row ``i`` of a batch exactly the tokens of that single run with ``seed + i``.
"""

from __future__ import annotations

import pytest
import torch

from gptlab.generate import generate_ids, prepare_decoding
from gptlab.generate.prepared import prepared_of

PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8], [1, 6, 1, 8, 0, 3, 3, 9]]
OPTIONS = [
    {"temperature": 0.9},
    {"temperature": 1.1, "top_k": 7},
    {"temperature": 0.8, "top_p": 0.85},
    {"temperature": 1.0, "min_p": 0.1, "top_k": 20},
    {"temperature": 0.9, "repetition_penalty": 1.3, "frequency_penalty": 0.2, "presence_penalty": 0.3},
    {"temperature": 1.0, "logit_bias": {5: 3.0, 7: -100.0}},
]
IDS = ["temperature", "top-k", "top-p", "min-p", "penalties", "bias"]
N = 10


def singles(model: torch.nn.Module, options: dict, seed: int) -> list[list[int]]:
    """Each prompt alone, with ``seed + i``, on the dynamic cache layer by layer."""
    prepare_decoding(model, compile="off", static=False)
    return [
        generate_ids(model, torch.tensor([p]), N, seed=seed + i, **options)[0, len(p) :].tolist()
        for i, p in enumerate(PROMPTS)
    ]


def batch(
    model: torch.nn.Module, options: dict, seed: int, prompts: list[list[int]] = PROMPTS
) -> list[list[int]]:
    out = generate_ids(model, torch.tensor(prompts), N, seed=seed, **options)
    return out[:, len(prompts[0]) :].tolist()


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
def test_a_batch_on_the_dynamic_cache_draws_what_single_runs_draw(tiny_model, options):
    model = tiny_model(pos="rope", jitter=0.3)
    expected = singles(model, options, 5)
    prepare_decoding(model, compile="off", static=False)
    assert batch(model, options, 5) == expected
    assert batch(model, options, 6, PROMPTS[1:]) == expected[1:]  # row i is seed + i, whatever the batch


@pytest.mark.parametrize("options", OPTIONS, ids=IDS)
@pytest.mark.parametrize("pos", ["learned", "rope", "alibi"])
def test_the_static_cache_draws_what_the_dynamic_one_draws(tiny_model, options, pos):
    model = tiny_model(pos=pos, jitter=0.3)
    expected = singles(model, options, 11)
    prepare_decoding(model, compile="off", static=True)  # the in-graph sampler, run eagerly
    assert "static" in str(prepared_of(model).plan(len(PROMPTS)))
    assert batch(model, options, 11) == expected
    one = generate_ids(model, torch.tensor([PROMPTS[2]]), N, seed=13, **options)[0, len(PROMPTS[2]) :]
    assert one.tolist() == expected[2]


def test_the_traced_static_step_draws_what_the_eager_one_draws(tiny_model):
    # torch.compile traces the static step (dynamo, whole graph; the eager back-end keeps it quick)
    model = tiny_model(pos="rope", jitter=0.3)
    options = OPTIONS[4]
    expected = singles(model, options, 21)
    prepare_decoding(
        model, compile="on", static=True, compile_options={"backend": "eager", "fullgraph": True}
    )
    plan = prepared_of(model).plan(len(PROMPTS))
    assert plan.step == "compiled"
    assert batch(model, options, 21) == expected


@pytest.mark.slow
@pytest.mark.parametrize("options", [OPTIONS[1], OPTIONS[4]], ids=["top-k", "penalties"])
def test_inductors_compiled_steps_draw_what_the_layers_draw(tiny_model, options):
    model = tiny_model(pos="rope", jitter=0.3)
    expected = singles(model, options, 31)
    prepare_decoding(model, compile="on")  # batches: the frozen static step; one row: the fused step
    assert prepared_of(model).plan(len(PROMPTS)).step == "frozen"
    assert batch(model, options, 31) == expected
    assert prepared_of(model).plan(1).step == "fused"
    one = generate_ids(model, torch.tensor([PROMPTS[1]]), N, seed=32, **options)[0, len(PROMPTS[1]) :]
    assert one.tolist() == expected[1]


TEXT_OPTIONS = {"temperature": 0.9, "top_k": 7, "presence_penalty": 0.3}


def served_texts(model: torch.nn.Module, tok, prompts: list[str], seed: int) -> tuple[list[str], object]:
    """Each prompt sent at once, concurrently, to a fresh server, with the same seed → the texts and
    the server's session (its lanes)."""
    import threading

    from fastapi.testclient import TestClient

    from gptlab.serve import create_app

    app = create_app(model, tok, model_name="tiny", max_batch=4, max_tokens_cap=64, max_body_bytes=4096)
    out = [""] * len(prompts)
    with TestClient(app) as client:

        def call(i: int) -> None:
            body = {"prompt": prompts[i], "max_tokens": N, "seed": seed, **TEXT_OPTIONS}
            r = client.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            out[i] = r.json()["choices"][0]["text"]

        threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        session = app.state.scheduler.session
    return out, session


@pytest.mark.parametrize("static", [False, True], ids=["dynamic-lane", "static-lane"])
def test_the_server_draws_what_the_library_draws_for_a_seed(tiny_model, char_tok, static):
    from gptlab.generate import SampleConfig, generate_text

    model = tiny_model(vocab_size=char_tok.vocab_size, pos="rope", jitter=0.3)
    prompts = ["abc", "hello", "xyz"]
    config = SampleConfig(max_new_tokens=N, seed=41, **TEXT_OPTIONS)
    prepare_decoding(model, compile="off", static=False)
    expected = [generate_text(model, char_tok, p, config) for p in prompts]
    prepare_decoding(model, compile="off", static=static)  # the server's static lane on a CPU when asked
    texts, lanes = served_texts(model, char_tok, prompts, 41)
    assert texts == expected
    if static:  # the static lane really decoded them
        assert lanes.static is not None and lanes.static.captures > 0


def test_gptlab_sample_draws_sample_i_with_seed_plus_i(tiny_model, char_tok, tmp_path, capsys):
    import gptlab
    from gptlab.cli import main
    from gptlab.generate import SampleConfig, generate_text

    model = tiny_model(vocab_size=char_tok.vocab_size, pos="rope", jitter=0.3)
    ckpt = gptlab.save(model, char_tok, tmp_path / "c")
    args = ["sample", str(ckpt), "--prompt", "abc", "--max-new-tokens", str(N), "--num-samples", "2"]
    args += ["--seed", "8", "--temperature", "0.9", "--top-k", "7", "--presence-penalty", "0.3"]
    assert main(args) == 0
    out = capsys.readouterr().out
    loaded, tok = gptlab.load(ckpt)
    for i in range(2):
        text = generate_text(loaded, tok, "abc", SampleConfig(max_new_tokens=N, seed=8 + i, **TEXT_OPTIONS))
        assert "abc" + text in out
