"""Dataset preparation and batch sampling (gptlab.data)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from gptlab import data as gdata
from gptlab.data import EOT, TokenDataset, WindowSampler, eval_batches, prepare, token_dtype
from gptlab.errors import GptlabError
from gptlab.tokenizers import load as load_tokenizer


def _docs(tmp_path):
    corpus = tmp_path / "corpus"
    (corpus / "sub").mkdir(parents=True)
    docs = ["First doc: héllo wörld.\n" * 30, "Second — with ünïcode ✓ and more text.\n" * 25]
    (corpus / "a.txt").write_text(docs[0], encoding="utf-8")
    (corpus / "sub" / "b.md").write_text(docs[1], encoding="utf-8")
    (corpus / "ignored.bin").write_bytes(b"\0\1\2")  # not a text suffix: not picked up from a directory
    jl = tmp_path / "more.jsonl"
    extra = [f"a jsonl document number {i} with some words" * 3 for i in range(4)]
    jl.write_text(
        "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(extra)), encoding="utf-8"
    )
    return [corpus, jl], docs + extra


@pytest.mark.parametrize("spec", ["char", "bpe:300"])
def test_round_trip_with_tokenizer(tmp_path, spec):
    inputs, docs = _docs(tmp_path)
    meta = prepare(inputs, tmp_path / "ds", tokenizer=spec, val_fraction=0.2, block_size=8)
    ds = TokenDataset(tmp_path / "ds")
    tok = load_tokenizer(tmp_path / "ds" / "tokenizer.json")
    ids = np.concatenate([ds.split("train"), ds.split("val")]).tolist()
    assert tok.eot_id is not None  # several documents: separated by <|endoftext|>
    assert tok.decode(ids) == EOT.join(docs)
    assert meta["train_tokens"] + meta["val_tokens"] == len(ids)
    assert meta["val_tokens"] == int(len(ids) * 0.2)
    assert ds.split("train").dtype == np.uint16
    assert meta["train_bytes"] + meta["val_bytes"] == len(EOT.join(docs).encode())
    assert [s["bytes"] for s in meta["sources"]] == [(p.stat().st_size) for p in gdata.find_sources(inputs)]


def test_streaming_chunks_equal_one_pass(tmp_path, monkeypatch):
    text = "".join(f"line {i} ünï ✓ " * (i % 7) + "\n" for i in range(3000))
    (tmp_path / "t.txt").write_text(text, encoding="utf-8")
    prepare([tmp_path / "t.txt"], tmp_path / "a", block_size=8)
    monkeypatch.setattr(gdata.sources, "CHUNK_BYTES", 97)  # chunks cut mid-character and mid-line
    prepare([tmp_path / "t.txt"], tmp_path / "b", block_size=8)
    for split in ("train", "val"):
        assert np.array_equal(
            TokenDataset(tmp_path / "a").split(split), TokenDataset(tmp_path / "b").split(split)
        )
    tok = TokenDataset(tmp_path / "b").tokenizer
    assert tok.eot_id is None  # one document: no separator token
    assert (
        tok.decode(np.concatenate([TokenDataset(tmp_path / "b").split(s) for s in ("train", "val")]).tolist())
        == text
    )


def test_token_dtype_fits_vocabulary():
    assert token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32


def test_prepare_is_idempotent_and_refuses_a_different_dataset(tmp_path):
    (tmp_path / "a.txt").write_text("abcdefgh\n" * 100)
    (tmp_path / "b.txt").write_text("zyxwvuts\n" * 100)
    m1 = prepare([tmp_path / "a.txt"], tmp_path / "ds", block_size=8)
    assert prepare([tmp_path / "a.txt"], tmp_path / "ds", block_size=8) == m1
    with pytest.raises(GptlabError, match="different dataset"):
        prepare([tmp_path / "b.txt"], tmp_path / "ds", block_size=8)


@pytest.mark.parametrize(
    "content, match",
    [
        (b"", "empty"),
        (b"hello\x00world" * 10, r"binary.*offset 5"),
        (b"good text " * 20 + b"\xff\xfe bad", r"not UTF-8.*offset 200"),
        (b"tiny", "too small"),
    ],
)
def test_bad_corpus_leaves_nothing_behind(tmp_path, content, match):
    (tmp_path / "in.txt").write_bytes(content)
    with pytest.raises(GptlabError, match=match):
        prepare([tmp_path / "in.txt"], tmp_path / "out", block_size=8)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["in.txt"]


def test_sampler_is_a_function_of_the_step_and_splits_cleanly():
    tokens = np.arange(5000, dtype=np.uint16)
    a = WindowSampler(tokens, 16, 8, seed=3)
    b = WindowSampler(tokens, 16, 8, seed=3)
    x, y = a.batch(7)
    assert torch.equal(x, b.batch(7)[0]) and torch.equal(y[:, :-1], x[:, 1:])  # y is x shifted by one
    assert not torch.equal(x, a.batch(8)[0])
    # accumulation: two micro-batches of 4 hold the rows of one of 8; so do two ranks of 4
    acc = WindowSampler(tokens, 16, 4, seed=3, grad_accum=2)
    assert torch.equal(torch.cat([acc.batch(7, 0)[0], acc.batch(7, 1)[0]]), x)
    ranks = [WindowSampler(tokens, 16, 4, seed=3, world_size=2, rank=r) for r in range(2)]
    assert torch.equal(torch.cat([r.batch(7)[0] for r in ranks]), x)
    # an epoch visits each window once: no repeated start offsets
    starts = a.starts(np.arange(a.n))
    assert len(np.unique(starts)) == a.n and starts.max() + 17 <= len(tokens)


def test_eval_batches_cover_the_split():
    tokens = np.arange(1000, dtype=np.uint16)
    batches = list(eval_batches(tokens, 10, 7))
    xs = torch.cat([x for x, _ in batches])
    assert xs.shape == ((1000 - 1) // 10, 10) and torch.equal(xs.flatten(), torch.arange(990))
    assert sum(len(x) for x, _ in eval_batches(tokens, 10, 7, max_batches=2)) == 14
