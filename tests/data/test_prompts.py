"""Prompts for reinforcement (``prepare --format prompts``): rendering with the generation prompt, the
held-out split, extra fields kept for the reward, bad lines named, the CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gptlab import checkpoint as ckpt
from gptlab.cli import main
from gptlab.data.chat import _chatml
from gptlab.data.prompts import PromptDataset, prepare_prompts
from gptlab.errors import GptlabError
from gptlab.sources import model_tokenizer
from gptlab.tokenizers import CharTokenizer
from tests._tiny import tiny_model

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
ALPHABET = "abcdefghijklmnopqrstuvwxyz0123456789 +=?\n"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("prompts")
    tok = CharTokenizer.from_text(ALPHABET, special_tokens=SPECIALS)
    ckpt.save(tiny_model(vocab_size=tok.vocab_size, block_size=64, n_layer=1, n_head=2), tok, root / "base")
    return root


def _write(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def _prepare(base, src, out, **kwargs):
    return prepare_prompts(
        [src], out, tokenizer=str(base / "base"), model_tokenizer=model_tokenizer, block_size=64, **kwargs
    )


def test_prompts_round_trip_with_generation_prompt_and_extra_fields(base, tmp_path):
    records = [{"prompt": f"{i}+{i}=?", "answer": str(2 * i), "id": i} for i in range(18)]
    records.append(
        {
            "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "9+9=?"}],
            "answer": "18",
        }
    )
    records.append({"prompt": "x" * 80})  # over --block-size 64 once rendered: dropped and counted
    meta = _prepare(base, _write(tmp_path / "p.jsonl", records), tmp_path / "ds", val_fraction=0.2)
    assert meta["dropped"] == 1 and meta["examples"] == 19
    assert meta["val_prompts"] == 4 and meta["train_prompts"] == 15  # ⌈19·0.2⌉ held out
    data = PromptDataset(tmp_path / "ds")
    seen = []
    for split in ("train", "val"):
        for i in range(data.count(split)):
            text, example = data.record(split, i)
            messages = example.get("messages") or [{"role": "user", "content": example["prompt"]}]
            assert data.tokenizer.decode(data.prompt_ids(split, i)) == _chatml(messages, True)
            assert text == messages[-1]["content"] and example["answer"]  # the extra fields travel along
            seen.append(text)
    assert sorted(seen) == sorted([r["prompt"] for r in records[:18]] + ["9+9=?"])  # each prompt once
    assert data.longest() == max(
        len(data.prompt_ids(s, i)) for s in ("train", "val") for i in range(data.count(s))
    )
    # the same input gives the same split (seeded)
    _prepare(base, tmp_path / "p.jsonl", tmp_path / "again", val_fraction=0.2)
    again = PromptDataset(tmp_path / "again")
    assert [again.record("val", i) for i in range(4)] == [data.record("val", i) for i in range(4)]
    assert np.array_equal(np.asarray(again.split("train")), np.asarray(data.split("train")))


@pytest.mark.parametrize(
    ("record", "why"),
    [
        ("{not json", "not valid JSON"),
        ({"text": "hi"}, '"prompt"'),
        ({"prompt": "  "}, "non-empty"),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]},
            "ends on a user",
        ),
        ({"messages": [{"role": "robot", "content": "hi"}]}, "role"),
    ],
)
def test_a_bad_line_is_one_error_naming_file_and_line(base, tmp_path, record, why):
    src = _write(tmp_path / "p.jsonl", [{"prompt": "1+1=?"}, {"prompt": "2+2=?"}, record])
    with pytest.raises(GptlabError, match=rf"p\.jsonl:3: .*{why}") as err:
        _prepare(base, src, tmp_path / "ds")
    assert "\n" not in str(err.value)
    meta = _prepare(base, src, tmp_path / "skipped", skip_bad=True)
    assert meta["skipped_bad"] == 1 and meta["examples"] == 2


def test_prepare_cli_writes_a_prompts_dataset(base, tmp_path, capsys):
    src = _write(tmp_path / "p.jsonl", [{"prompt": f"{i}+1=?", "answer": str(i + 1)} for i in range(10)])
    argv = ["prepare", str(src), "--out", str(tmp_path / "ds"), "--format", "prompts"]
    assert main([*argv, "--tokenizer", str(base / "base"), "--block-size", "64", "--no-progress"]) == 0
    assert "9 train + 1 held-out prompts" in capsys.readouterr().out
    assert PromptDataset(tmp_path / "ds").count("val") == 1
    argv[3] = str(tmp_path / "other")
    assert main([*argv, "--tokenizer", "char"]) == 2  # the model's tokenizer is needed
    assert "needs the model's tokenizer" in capsys.readouterr().err
    (tmp_path / "t.txt").write_text("some plain text to tokenize " * 20)
    assert (
        main(["prepare", str(tmp_path / "t.txt"), "--out", str(tmp_path / "text"), "--block-size", "8"]) == 0
    )
    with pytest.raises(GptlabError, match="not a prompts dataset"):
        PromptDataset(tmp_path / "text")
