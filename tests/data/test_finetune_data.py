"""Instruction and chat data: rendering, loss masks, packing with example boundaries, bad records, training on it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from gptlab import checkpoint as ckpt
from gptlab.checkpoint.lora import ADAPTERS_FILE
from gptlab.cli import main
from gptlab.data import ChatOptions, TokenDataset, WindowSampler, eval_batches, prepare_alpaca, prepare_chat
from gptlab.data.chat import _chatml, segments
from gptlab.data.sampler import document_inputs
from gptlab.errors import GptlabError
from gptlab.sources import model_tokenizer
from gptlab.tokenizers import CharTokenizer
from gptlab.train import train
from gptlab.train.config import build_config
from gptlab.train.metrics import read_metrics
from tests._chat_data import ALPHABET, SPECIALS, write_jsonl
from tests._kill import kill_and_resume
from tests._tiny import TINY_TRAIN, tiny_model

SETTINGS = [t for t in TINY_TRAIN if not t.startswith("model.")] + ["batch_size=4", "eval_every=100"]


def _conversation(i: int) -> dict:
    return {
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": f"hi {i}"},
            {"role": "assistant", "content": f"hello {i}"},
            {"role": "user", "content": "and?"},
            {"role": "assistant", "content": f"bye {i % 5}"},
        ]
    }


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A small 'pretrained' checkpoint whose char tokenizer has ChatML's special tokens."""
    root = tmp_path_factory.mktemp("chat")
    tok = CharTokenizer.from_text(ALPHABET, special_tokens=SPECIALS)
    model = tiny_model(vocab_size=tok.vocab_size, block_size=256, n_layer=1, n_head=2, pos="rope")
    ckpt.save(model, tok, root / "base")
    write_jsonl(root / "chat.jsonl", [_conversation(i) for i in range(60)])
    return root


def _prepare(base, out, fmt="chat", src="chat.jsonl", block_size=127, **options):
    prep = {"chat": prepare_chat, "alpaca": prepare_alpaca}[fmt]
    return prep(
        [base / src],
        out,
        tokenizer=str(base / "base"),
        model_tokenizer=model_tokenizer,
        block_size=block_size,
        options=ChatOptions(**options),
    )


def test_masks_cover_exactly_every_assistant_turn(base, tmp_path):
    meta = _prepare(base, tmp_path / "ds", packing="padded")
    assert meta["examples"] == 60 and meta["loss_on"] == "assistant" and meta["packing"] == "padded"
    data = TokenDataset(tmp_path / "ds")
    tok = data.tokenizer
    tokens, mask = np.asarray(data.split("train")), np.asarray(data.arrays("train")["mask"])
    rows = len(tokens) // 128
    assert rows == meta["examples"] - round(60 * 0.1) and not (tmp_path / "ds" / "train.pos.bin").exists()
    for r in range(rows):
        row, m = tokens[r * 128 : (r + 1) * 128], mask[r * 128 : (r + 1) * 128]
        text = tok.decode(row[m == 1].tolist())
        i = int(tok.decode(row.tolist()).split("hi ")[1].split("<")[0])  # which conversation this row holds
        assert text == f"hello {i}<|im_end|>\nbye {i % 5}<|im_end|>\n"
    # with --prompt-loss everything but each example's first token counts
    _prepare(base, tmp_path / "all", packing="padded", prompt_loss=True)
    all_data = TokenDataset(tmp_path / "all")
    m = np.asarray(all_data.arrays("train")["mask"]).reshape(-1, 128)
    t = np.asarray(all_data.split("train")).reshape(-1, 128)
    real = t != all_data.tokenizer.eot_id
    assert (m[:, 0] == 0).all() and (m[:, 1:] == real[:, 1:]).all()


def test_the_sampler_ignores_masked_targets(base, tmp_path):
    _prepare(base, tmp_path / "ds")
    data = TokenDataset(tmp_path / "ds")
    arrays = data.arrays("train", 127)
    x, y, kw = WindowSampler(data.split("train"), 127, 3, seed=1, **arrays).inputs(0)
    assert x.shape == y.shape == (3, 127) and set(kw) == {"pos", "attn_mask"}
    text = data.tokenizer.decode(y[y != -1].tolist())
    assert text.count("<|im_end|>") == text.count("bye") + text.count("hello") > 0
    assert "hi" not in text and "system" not in text
    batches = list(eval_batches(data.split("val"), 127, 2, None, **data.arrays("val", 127)))
    assert all(len(b) == 3 for b in batches)
    # gptlab eval on instruction data: the rows, assistant tokens only
    from gptlab.evaluate.text import evaluate_path

    result, _ = evaluate_path(base / "base", data=tmp_path / "ds")
    assert result.tokens == sum(int((b[1] != -1).sum()) for b in batches)
    with pytest.raises(GptlabError, match="rows of 128 tokens"):
        data.arrays("train", 32)


def test_packed_examples_do_not_see_each_other(base, tmp_path):
    meta = _prepare(base, tmp_path / "ds", packing="packed", block_size=255)
    data = TokenDataset(tmp_path / "ds")
    tokens, pos = np.asarray(data.split("train")), np.asarray(data.arrays("train")["pos"])
    row, rpos = torch.tensor(tokens[:256].astype(np.int64)), torch.tensor(pos[:256].astype(np.int64))
    starts = (rpos == 0).nonzero().flatten().tolist()
    assert len(starts) >= 2 and meta["examples"] == 60  # several examples share a row
    model = tiny_model(vocab_size=data.vocab_size, block_size=256, n_head=2, pos="rope")
    s, e = starts[1], starts[2] if len(starts) > 2 else 256
    with torch.no_grad():
        packed = model.run(row[None, :-1], **document_inputs(rpos[None, :-1])).logits[0, s : min(e, 255)]
        alone = model(row[None, s:e])[0, : min(e, 255) - s]
        leaky = model(row[None, :-1])[0, s : min(e, 255)]  # without the boundaries it would see the first
    assert (packed - alone).abs().max() < 1e-5
    assert (leaky - alone).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ("{not json", "not valid JSON"),
        ({"messages": [{"role": "user", "content": "hi"}, {"content": "x"}]}, 'needs "role"'),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "  "}]},
            "empty assistant",
        ),
        (
            {"messages": [{"role": "user", "content": 3}, {"role": "assistant", "content": "a"}]},
            "must be a string",
        ),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "role 'wizard'"),
        ({"messages": [{"role": "user", "content": "hi"}]}, "no assistant turn"),
        ([1, 2], "an object"),
    ],
)
def test_bad_records_name_file_and_line(base, tmp_path, record, why):
    path = write_jsonl(tmp_path / "bad.jsonl", [_conversation(1), _conversation(2), record, _conversation(3)])
    with pytest.raises(GptlabError, match=rf"bad.jsonl:3: .*{why}"):
        prepare_chat(
            [path],
            tmp_path / "o",
            tokenizer=str(base / "base"),
            model_tokenizer=model_tokenizer,
            block_size=63,
        )
    meta = prepare_chat(
        [path],
        tmp_path / "ok",
        tokenizer=str(base / "base"),
        model_tokenizer=model_tokenizer,
        block_size=63,
        options=ChatOptions(skip_bad=True),
    )
    assert meta["skipped_bad"] == 1 and meta["examples"] == 3


def test_cli_bad_record_is_one_line_and_counts_are_reported(base, tmp_path, capsys):
    write_jsonl(tmp_path / "bad.jsonl", [_conversation(1), {"messages": "nope"}])
    argv = ["prepare", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "o"), "--format", "chat"]
    assert main([*argv, "--tokenizer", str(base / "base"), "--block-size", "63"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.jsonl:2" in err and "--skip-bad" in err
    assert main([*argv, "--tokenizer", "char"]) == 2 and "model's tokenizer" in capsys.readouterr().err
    long = [_conversation(i) for i in range(6)] + [
        {"messages": [{"role": "user", "content": "x" * 150}, {"role": "assistant", "content": "y" * 10}]}
    ]
    write_jsonl(tmp_path / "long.jsonl", long)
    common = ["--format", "chat", "--tokenizer", str(base / "base"), "--block-size", "127"]
    assert (
        main(
            [
                "prepare",
                str(tmp_path / "long.jsonl"),
                "--out",
                str(tmp_path / "d1"),
                *common,
                "--too-long",
                "drop",
            ]
        )
        == 0
    )
    assert "dropped 1" in capsys.readouterr().out
    assert main(["prepare", str(tmp_path / "long.jsonl"), "--out", str(tmp_path / "d2"), *common]) == 0
    out = capsys.readouterr().out  # truncation keeps it only if an assistant token survives: here none does
    assert "dropped 1" in out and "truncated 0" in out


def test_alpaca_records_become_one_user_and_one_assistant_turn(base, tmp_path):
    records = [
        {"instruction": f"say {i}", "input": "" if i % 2 else "loud", "output": f"ok {i}"} for i in range(20)
    ]
    (base / "a.json").write_text(json.dumps(records))
    meta = _prepare(base, tmp_path / "ds", fmt="alpaca", src="a.json", packing="padded")
    data = TokenDataset(tmp_path / "ds")
    row = np.asarray(data.split("train"))[:128]
    m = np.asarray(data.arrays("train")["mask"])[:128]
    text = data.tokenizer.decode(row.tolist())
    assert meta["examples"] == 20 and "<|im_start|>user\nsay" in text
    assert data.tokenizer.decode(row[m == 1].tolist()).startswith("ok ")
    with pytest.raises(GptlabError, match='b.json:2: "output"'):
        (tmp_path / "b.json").write_text(json.dumps([records[0], {"instruction": "x"}]))
        prepare_alpaca(
            [tmp_path / "b.json"],
            tmp_path / "o",
            tokenizer=str(base / "base"),
            model_tokenizer=model_tokenizer,
            block_size=63,
        )


def test_segments_of_a_template_that_is_not_prefix_consistent_are_refused():
    msgs = _conversation(0)["messages"]
    pieces = segments(msgs, _chatml)
    assert "".join(t for t, _ in pieces) == _chatml(msgs, False)
    assert [t for t, a in pieces if a] == ["hello 0<|im_end|>\n", "bye 0<|im_end|>\n"]
    with pytest.raises(GptlabError, match="prefix"):
        segments(msgs, lambda m, gen: f"{len(m)}" + _chatml(m, gen))


# ---------------------------------------------------------------- training on chat data, killed and resumed
def _launch(base, run, *extra, resume=False):
    argv = [sys.executable, "-m", "gptlab", "train", "--out", str(run), *SETTINGS, *extra]
    argv += ["--resume"] if resume else ["--data", str(base / "cds")]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_a_run_from_weights_trains_on_the_rows_of_instruction_data_without_being_told(base, tmp_path):
    """Examples stored in rows of 128 tokens (``--block-size 127``), a 256-token RoPE base: without
    ``model.block_size`` the run trains on the rows (it answered "train with model.block_size=127")."""
    if not (base / "cds").exists():
        _prepare(base, base / "cds")
    settings = [f"init={base / 'base'}", "finetune=lora", "max_steps=1", "eval_every=1", "eval_batches=1"]
    result = train(build_config("finetune", [*SETTINGS, *settings]), base / "cds", tmp_path / "run")
    assert ckpt.read_config(result.checkpoint / ckpt.CONFIG_FILE).block_size == 127


def test_lora_on_chat_data_survives_sigkill_bitwise(base, tmp_path):
    if not (base / "cds").exists():
        _prepare(base, base / "cds")
    settings = [
        f"init={base / 'base'}",
        "finetune=lora",
        "lora_dropout=0.1",
        "model.block_size=127",
        "max_steps=16",
        "ckpt_every=2",
        "keep_last=2",
        "eval_every=8",
        "lr=1e-2",
    ]
    reference = train(build_config("finetune", [*SETTINGS, *settings]), base / "cds", tmp_path / "ref")
    losses = [r["loss"] for r in read_metrics(tmp_path / "ref" / "metrics.jsonl") if "loss" in r]
    assert losses[-1] < losses[0]  # the masked loss goes down
    run = tmp_path / "run"
    kill_and_resume(lambda resume: _launch(base, run, *settings, resume=resume), run, kills=2, most_steps=5)
    final = ckpt.resolve_checkpoint(run)
    a = ckpt.read_tensors(final / ADAPTERS_FILE)
    b = ckpt.read_tensors(reference.checkpoint / ADAPTERS_FILE)
    assert final.name == "ckpt-16" and a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)  # killed and resumed = never interrupted, bitwise
