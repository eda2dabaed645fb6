"""The other architectures' recipes as a user runs them: ``mlm-char`` (train, fill) and
``seq2seq-toy`` (write pairs, prepare, train, sample), and concurrent encoder–decoder requests
to the server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
import torch

from gptlab import checkpoint as ckpt
from gptlab.cli import main
from gptlab.generate import SampleConfig, generate_text
from gptlab.model import EncoderDecoder, GPTConfig
from gptlab.tokenizers import CharTokenizer
from tests import ROOT


def test_toy_recipe_from_the_command_line(tmp_path, capsys) -> None:
    pairs = tmp_path / "reverse.jsonl"
    env = {"PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        str(ROOT / "bench" / "seq2seq_toy.py"),
        "--write-data",
        str(pairs),
        "--pairs",
        "300",
    ]
    subprocess.run(cmd, check=True, env=env, capture_output=True, timeout=120)
    rows = [json.loads(line) for line in pairs.read_text().splitlines()]
    assert len(rows) == 300 and all(r["target"] == r["source"][::-1] for r in rows)
    assert len({r["source"] for r in rows}) == 300

    data, run = tmp_path / "data", tmp_path / "run"
    assert (
        main(["prepare", "--format", "pairs", str(pairs), "--out", str(data), "--val-fraction", "0.05"]) == 0
    )
    train = ["train", "--config", "seq2seq-toy", "--data", str(data), "--out", str(run)]
    assert main([*train, "max_steps=3", "eval_every=3", "threads=1", "progress=false"]) == 0
    model, tok = ckpt.load(run)
    assert model.config.arch == "encoder-decoder" and model.config.n_encoder_layer == 2  # the recipe's
    capsys.readouterr()
    for flags, config in (
        (["--temperature", "0"], SampleConfig(temperature=0.0, max_new_tokens=8)),
        (["--beam-width", "4"], SampleConfig(beam_width=4, max_new_tokens=8)),
    ):
        assert main(["sample", str(run), "--prompt", "abcdef", "--max-new-tokens", "8", *flags]) == 0
        printed = capsys.readouterr().out
        assert printed.strip() == generate_text(model, tok, "abcdef", config).strip()


def test_mlm_char_recipe_from_the_command_line(tmp_path, capsys) -> None:
    from gptlab.train import build_config

    cfg = build_config("mlm-char")
    assert cfg.objective == "mlm" and cfg.mlm_rate == 0.15 and cfg.model["arch"] == "encoder"
    text = tmp_path / "corpus.txt"
    text.write_text("To be, or not to be, that is the question. " * 60, encoding="utf-8")
    assert main(["prepare", str(text), "--out", str(tmp_path / "data")]) == 0
    small = ["model.n_layer=1", "model.n_embd=32", "model.block_size=32", "batch_size=4", "eval_every=2"]
    train = [
        "train",
        "--config",
        "mlm-char",
        "--data",
        str(tmp_path / "data"),
        "--out",
        str(tmp_path / "run"),
    ]
    assert main([*train, "max_steps=2", "threads=1", "progress=false", *small]) == 0
    model, tok = ckpt.load(tmp_path / "run")
    assert model.config.arch == "encoder" and not model.config.causal and model.config.mlp == "relu2"
    capsys.readouterr()
    assert main(["fill", str(tmp_path / "run"), "To be, or not to b[MASK], that", "--top-k", "3"]) == 0
    first, filled = capsys.readouterr().out.splitlines()
    assert first.startswith("[MASK] 1") and len(filled) == len("To be, or not to bX, that")


@pytest.fixture(scope="module")
def s2s_model():
    torch.manual_seed(3)
    tok = CharTokenizer.from_text("abcdefghij", special_tokens=["<|endoftext|>"])
    config = GPTConfig(
        vocab_size=tok.vocab_size,
        block_size=32,
        n_layer=2,
        n_head=2,
        n_embd=32,
        arch="encoder-decoder",
        init_std=0.3,  # large random weights: the target depends strongly on the source
    )
    return EncoderDecoder(config).eval(), tok


def test_four_concurrent_requests_each_get_their_own_target(s2s_model) -> None:
    from fastapi.testclient import TestClient

    from gptlab.serve import create_app

    model, tok = s2s_model
    no_eos = {str(tok.eot_id): -100}  # an untrained model: keep it from ending at once
    requests = [
        {"prompt": "abcdefgh", "temperature": 0},
        {"prompt": "jihg", "temperature": 0},
        {"prompt": "aaaabbbb", "beam_width": 3},
        {"prompt": "cafe", "temperature": 0.9, "seed": 7},
    ]
    with TestClient(create_app(model, tok)) as client:

        def post(body: dict) -> str:
            r = client.post("/v1/completions", json={"max_tokens": 24, "logit_bias": no_eos, **body})
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["text"]

        alone = [post(body) for body in requests]  # one at a time
        results: dict[int, str] = {}
        threads = [
            threading.Thread(target=lambda i=i: results.__setitem__(i, post(requests[i])))
            for i in range(len(requests))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    assert [results[i] for i in range(4)] == alone  # together: each request still gets its own target
    for body, text in zip(requests[:3], alone[:3], strict=True):
        extra = {k: v for k, v in body.items() if k in ("temperature", "beam_width")}
        config = SampleConfig(max_new_tokens=24, logit_bias=no_eos, **extra)
        want = generate_text(model, tok, body["prompt"], config)
        assert text == want
    assert len(set(alone)) == 4  # different sources, different targets
