"""Encoder–decoder data, training, generation (every strategy, cached = uncached) and serving."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gptlab import checkpoint as ckpt
from gptlab.cli import main
from gptlab.data.pairs import PairDataset, prepare_pairs, toy_pairs
from gptlab.errors import GptlabError
from gptlab.generate import BatchSession, SampleConfig, generate_batch, generate_text, stream_events
from gptlab.generate import driver as s2s
from gptlab.model import EncoderDecoder
from gptlab.train import build_config, train
from gptlab.train.objectives import make_objective
from tests._tiny import TINY_TRAIN, tiny_model

S2S_TRAIN = [
    *TINY_TRAIN,
    "objective=seq2seq",
    "model.arch=encoder-decoder",
    "model.n_encoder_layer=1",
    "batch_size=8",
    "eval_batches=2",
]


@pytest.fixture(scope="module")
def pairs_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("pairs")
    rows = toy_pairs("reverse", 120, seed=1, max_len=6)
    (root / "rev.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def data(pairs_dir):
    assert (
        main(["prepare", "--format", "pairs", str(pairs_dir / "rev.jsonl"), "--out", str(pairs_dir / "d")])
        == 0
    )
    return pairs_dir / "d"


@pytest.fixture(scope="module")
def run(data, tmp_path_factory):
    out = tmp_path_factory.mktemp("s2srun") / "run"
    train(build_config(None, [*S2S_TRAIN, "max_steps=6", "eval_every=6"]), data, out)
    return out


def test_pairs_are_stored_with_bos_eos_and_padding(data, pairs_dir) -> None:
    ds = PairDataset(data)
    rows = [json.loads(line) for line in (pairs_dir / "rev.jsonl").read_text().splitlines()]
    src, tgt = ds.rows("train")
    assert len(src) + len(ds.rows("val")[0]) == len(rows) == 120
    tok, eot, pad = ds.tokenizer, ds.tokenizer.eot_id, ds.pad_id
    first_src = [int(t) for t in src[0] if t != pad]
    first_tgt = [int(t) for t in tgt[0] if t != pad]
    assert tok.decode(first_src) == rows[0]["source"]
    assert first_tgt[0] == eot and first_tgt[-1] == eot and tok.decode(first_tgt[1:-1]) == rows[0]["target"]
    s, s_mask, t_in, t_out = ds.batch("train", np.arange(8))
    assert torch.equal(s_mask, torch.from_numpy(src[:8, : s.size(1)].astype(np.int64)) != pad)
    assert (t_out[t_in == 0][1:] == -1).any() or (t_out != -1).all()
    n_targets = sum(len(r["target"]) + 1 for r in rows[:8])  # target tokens + EOS: the loss positions
    assert int((t_out != -1).sum()) == n_targets
    assert torch.equal(t_in[:, 1:][t_out[:, :-1] != -1], t_out[:, :-1][t_out[:, :-1] != -1])  # shifted by one


def test_bad_pairs_are_one_clear_error(tmp_path) -> None:
    (tmp_path / "bad.jsonl").write_text('{"source": "ab", "target": "ba"}\n{"source": "x"}\n')
    with pytest.raises(GptlabError, match="bad.jsonl:2"):
        prepare_pairs([tmp_path / "bad.jsonl"], tmp_path / "out")
    assert (
        main(["prepare", "--format", "pairs", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o")]) == 2
    )


def test_seq2seq_objective_loss_is_on_target_tokens(data) -> None:
    obj = make_objective(build_config(None, S2S_TRAIN), data)
    assert obj.model_config.arch == "encoder-decoder"
    batch = obj.batch(0, 0, "cpu")
    assert all(torch.equal(a, b) for a, b in zip(batch, obj.batch(0, 0, "cpu"), strict=True))
    model = EncoderDecoder(obj.model_config)
    src, mask, t_in, t_out = batch
    logits = model(t_in, source=src, source_mask=mask)
    keep = t_out != -1
    expected = torch.nn.functional.cross_entropy(logits[keep], t_out[keep])
    torch.testing.assert_close(obj.loss(model, batch), expected)
    with pytest.raises(GptlabError, match="not a pairs dataset"):
        text = data.parent / "text"
        from gptlab.data import prepare

        (data.parent / "t.txt").write_text("hello world " * 50)
        prepare([data.parent / "t.txt"], text, block_size=8)
        make_objective(build_config(None, S2S_TRAIN), text)


def _model(**kw) -> EncoderDecoder:
    return tiny_model(
        **{"vocab_size": 23, "block_size": 24, "init_std": 0.3, "arch": "encoder-decoder", **kw}
    )


@pytest.mark.parametrize(
    "options",
    [
        dict(pos="learned"),
        dict(pos="rope", n_kv_head=2, mlp="swiglu"),
        dict(pos="alibi", norm_placement="post"),
    ],
    ids=lambda o: str(o["pos"]),
)
def test_cached_generation_equals_uncached_within_1e_5(options: dict) -> None:
    model = _model(**options)
    source = torch.randint(0, 22, (9,)).tolist()
    reference = s2s.greedy_uncached(model, source, 22, 12)
    session = BatchSession(model.bind(source), max_batch=1)
    slot, logits = session.add([22])
    for ref in reference:
        torch.testing.assert_close(logits, ref, atol=1e-5, rtol=0)
        logits = session.step({slot: int(ref.argmax())})[slot]
    config = SampleConfig(temperature=0.0, max_new_tokens=12)
    tokens, reason = s2s.target_ids(model, source, 22, config)
    assert tokens == [int(r.argmax()) for r in reference] and reason == "length"


def test_every_strategy_runs_on_an_encoder_decoder() -> None:
    model = _model(pos="rope")
    source = [3, 4, 5, 6]
    greedy, _ = s2s.target_ids(model, source, 22, SampleConfig(temperature=0.0, max_new_tokens=8))
    for cfg in (
        SampleConfig(temperature=0.8, top_k=5, seed=1, max_new_tokens=8),
        SampleConfig(top_p=0.9, min_p=0.05, repetition_penalty=1.2, seed=2, max_new_tokens=8),
    ):
        a, _ = s2s.target_ids(model, source, 22, cfg)
        b, _ = s2s.target_ids(model, source, 22, cfg)
        assert a == b and len(a) == 8 and all(0 <= t < 23 for t in a)  # seeded: reproducible
    beam, _ = s2s.target_ids(
        model, source, 22, SampleConfig(beam_width=4, length_penalty=0.0, max_new_tokens=8)
    )
    one, _ = s2s.target_ids(model, source, 22, SampleConfig(beam_width=1, temperature=0.0, max_new_tokens=8))
    assert one == greedy

    @torch.no_grad()
    def logp(tokens: list[int]) -> float:
        ids = torch.tensor([[22, *tokens]])
        logits = model(ids[:, :-1], source=torch.tensor([source]))
        return float(torch.log_softmax(logits, -1)[0].gather(1, ids[0, 1:, None]).sum())

    assert len(beam) == 8 and logp(beam) >= logp(greedy) - 1e-5  # beam finds at least greedy's score


def test_train_resume_sample_eval_and_serve_an_encoder_decoder(run, data, tmp_path, capsys) -> None:
    model, tok = ckpt.load(run)
    assert isinstance(model, EncoderDecoder) and model.config.n_encoder_layer == 1
    out = build_config(None, [*S2S_TRAIN, "max_steps=8"])
    capsys.readouterr()
    resumed = tmp_path / "resumed"
    train(build_config(None, [*S2S_TRAIN, "max_steps=4", "eval_every=4"]), data, resumed)
    assert main(["train", "--out", str(resumed), "--resume", "max_steps=6"]) == 0
    assert out.objective == "seq2seq"
    capsys.readouterr()
    for extra in ([], ["--beam-width", "3"], ["--temperature", "0.7", "--top-k", "4", "--seed", "1"]):
        assert main(["sample", str(run), "--prompt", "abcd", "--max-new-tokens", "6", *extra]) == 0
        text = capsys.readouterr().out
        assert not text.startswith("abcd")  # the output is the target, not a continuation
    assert main(["sample", str(run), "--prompt", ""]) == 2
    assert "needs a source" in capsys.readouterr().err

    from fastapi.testclient import TestClient

    from gptlab.serve import create_app

    with TestClient(create_app(model, tok)) as client:
        for extra in ({}, {"beam_width": 2}):
            r = client.post(
                "/v1/completions", json={"prompt": "abc", "max_tokens": 5, "temperature": 0, **extra}
            )
            assert r.status_code == 200, r.text
            want = generate_text(model, tok, "abc", SampleConfig(temperature=0, max_new_tokens=5, **extra))
            assert r.json()["choices"][0]["text"] == want


def test_eval_on_a_pairs_dataset(run, data, capsys) -> None:
    assert main(["eval", str(run), "--data", str(data)]) == 0
    assert "loss" in capsys.readouterr().out


def test_the_public_entry_points_take_an_encoder_decoder(run) -> None:
    """``generate_text``, ``stream_events`` and ``generate_batch`` read the prompt as the source; no
    caller branches on the model kind."""
    model, tok = ckpt.load(run)
    config = SampleConfig(temperature=0, max_new_tokens=6)
    eot = tok.eot_id
    for source in ("abc", "dcba"):
        ids, _ = s2s.target_ids(model, s2s.source_ids(tok, source), eot, config.replace(stop_tokens=[eot]))
        text = generate_text(model, tok, source, config)
        assert text == tok.decode(ids)
        assert "".join(e.text for e in stream_events(model, tok, source, config)) == text
    assert generate_batch(model, tok, ["abc", "dcba"], config) == [
        generate_text(model, tok, p, config) for p in ("abc", "dcba")
    ]
