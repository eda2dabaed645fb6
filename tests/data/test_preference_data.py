"""Preference pairs (``gptlab prepare --format preference``): rendering, answer masks, the split, bad lines."""

from __future__ import annotations

import json

import numpy as np
import pytest

from gptlab import checkpoint as ckpt
from gptlab.cli import main
from gptlab.data import ChatOptions
from gptlab.data.chat import _chatml
from gptlab.data.preference import PreferenceDataset, prepare_preference
from gptlab.errors import GptlabError
from gptlab.sources import model_tokenizer
from gptlab.tokenizers import CharTokenizer
from tests._chat_data import ALPHABET, SPECIALS, write_jsonl
from tests._tiny import tiny_model


def pair(i: int) -> dict:
    if i % 2:  # a chat prompt with an earlier assistant turn, answers as assistant messages
        return {
            "messages": [
                {"role": "system", "content": "be kind"},
                {"role": "user", "content": f"hi {i}"},
                {"role": "assistant", "content": "hello"},
                {"role": "user", "content": f"what is {i}?"},
            ],
            "chosen": {"role": "assistant", "content": f"it is {i}."},
            "rejected": [{"role": "assistant", "content": "no idea"}],
        }
    return {"prompt": f"what is {i}?", "chosen": f"it is {i}.", "rejected": "go away"}


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("pref")
    tok = CharTokenizer.from_text(ALPHABET, special_tokens=SPECIALS)
    model = tiny_model(vocab_size=tok.vocab_size, block_size=128, n_layer=1, n_head=2, pos="rope")
    ckpt.save(model, tok, root / "base")
    write_jsonl(root / "pairs.jsonl", [pair(i) for i in range(40)])
    return root


def prepare(base, out, src="pairs.jsonl", **kwargs):
    return prepare_preference(
        [base / src], out, tokenizer=str(base / "base"), model_tokenizer=model_tokenizer, **kwargs
    )


def test_round_trip_masks_only_the_final_answers(base, tmp_path):
    meta = prepare(base, tmp_path / "ds", block_size=127, val_fraction=0.25)
    assert meta["train_pairs"] == 30 and meta["val_pairs"] == 10 and meta["template"] == "chatml"
    data = PreferenceDataset(tmp_path / "ds")
    tok = data.tokenizer
    seen = set()
    for split in ("train", "val"):
        n = data.pairs(split)
        x, y = data.batch(split, np.arange(n))
        assert x.shape[0] == 2 * n
        for j in range(n):
            full = tok.decode([t for t in x[j].tolist() + [y[j, -1].item()] if t >= 0])
            i = int(full.split("what is ")[1].split("?")[0])
            seen.add(i)
            chosen, rejected = (
                tok.decode(y[j][y[j] >= 0].tolist()),
                tok.decode(y[n + j][y[n + j] >= 0].tolist()),
            )
            assert chosen == f"it is {i}.<|im_end|>\n"  # the answer and its end of turn, nothing else
            assert rejected == ("no idea" if i % 2 else "go away") + "<|im_end|>\n"
            messages = pair(i).get("messages") or [{"role": "user", "content": pair(i)["prompt"]}]
            prompt = _chatml(messages, True)
            assert full.startswith(prompt)  # rendered by the template, prompt first
    assert seen == set(range(40))  # every pair in exactly one split


def test_cli_prepares_and_reports(base, tmp_path, capsys):
    argv = ["prepare", str(base / "pairs.jsonl"), "--out", str(tmp_path / "cli"), "--format", "preference"]
    assert main([*argv, "--tokenizer", str(base / "base"), "--block-size", "127", "--no-progress"]) == 0
    assert "36 train + 4 val preference pairs" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"prompt": "q", "chosen": "a"}), 'missing "rejected"'),
        (json.dumps({"prompt": "q", "chosen": "a", "rejected": "a"}), "the same answer"),
        (json.dumps({"prompt": "", "chosen": "a", "rejected": "b"}), '"prompt" must be a non-empty'),
        (
            json.dumps(
                {
                    "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "x"}],
                    "chosen": "a",
                    "rejected": "b",
                }
            ),
            "end on a user turn",
        ),
        (
            json.dumps({"prompt": "q", "chosen": {"role": "user", "content": "a"}, "rejected": "b"}),
            "assistant",
        ),
        (json.dumps({"prompt": "q", "chosen": 3, "rejected": "b"}), "must be a string"),
    ],
)
def test_a_bad_line_is_one_error_naming_it(base, tmp_path, line, message):
    src = write_jsonl(tmp_path / "bad.jsonl", [pair(0), pair(1), line, pair(2)])
    with pytest.raises(GptlabError, match=f"bad.jsonl:3: .*{message}"):
        prepare_preference(
            [src], tmp_path / "out", tokenizer=str(base / "base"), model_tokenizer=model_tokenizer
        )
    assert not (tmp_path / "out").exists()
    meta = prepare_preference(
        [src],
        tmp_path / "skip",
        tokenizer=str(base / "base"),
        model_tokenizer=model_tokenizer,
        block_size=127,
        options=ChatOptions(skip_bad=True),
    )
    assert meta["skipped_bad"] == 1 and meta["pairs"] == 3 and meta["dropped"] == 0


def test_too_long_pairs_are_truncated_or_dropped(base, tmp_path):
    long = {"prompt": "tell me", "chosen": "x" * 200, "rejected": "y"}
    src = write_jsonl(tmp_path / "long.jsonl", [pair(0), pair(2), pair(4), long])
    kept = prepare_preference(
        [src],
        tmp_path / "t",
        tokenizer=str(base / "base"),
        model_tokenizer=model_tokenizer,
        block_size=63,
        val_fraction=0.25,
    )
    assert kept["truncated"] == 1 and kept["longest"] == 64
    dropped = prepare_preference(
        [src],
        tmp_path / "d",
        tokenizer=str(base / "base"),
        model_tokenizer=model_tokenizer,
        block_size=63,
        val_fraction=0.25,
        options=ChatOptions(too_long="drop"),
    )
    assert dropped["dropped"] == 1 and dropped["pairs"] == 3
    from gptlab.data import prepare_chat

    write_jsonl(
        tmp_path / "chat.jsonl",
        [{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}] * 4,
    )
    prepare_chat(
        [tmp_path / "chat.jsonl"],
        tmp_path / "chat",
        tokenizer=str(base / "base"),
        model_tokenizer=model_tokenizer,
    )
    with pytest.raises(GptlabError, match="not a preference dataset"):
        PreferenceDataset(tmp_path / "chat")


def test_records_may_pin_their_split(base, tmp_path):
    records = [{**pair(i), "split": "val" if i >= 6 else "train"} for i in range(8)]
    meta = prepare(base, tmp_path / "ds", src=write_jsonl(tmp_path / "s.jsonl", records), block_size=127)
    assert meta["train_pairs"] == 6 and meta["val_pairs"] == 2 and meta["split_by"] == "records"
    data = PreferenceDataset(tmp_path / "ds")
    x, _ = data.batch("val", np.arange(2))
    assert {int(data.tokenizer.decode(r.tolist()).split("what is ")[1].split("?")[0]) for r in x[:2]} == {
        6,
        7,
    }
    records[0].pop("split")
    with pytest.raises(GptlabError, match="on every record or on none"):
        prepare(base, tmp_path / "mixed", src=write_jsonl(tmp_path / "m.jsonl", records), block_size=127)
    records[0]["split"] = "test"
    with pytest.raises(GptlabError, match='m.jsonl:1: "split" must be'):
        prepare(base, tmp_path / "bad", src=write_jsonl(tmp_path / "m.jsonl", records), block_size=127)


def test_the_shipped_preference_set_is_what_its_script_writes(tmp_path):
    """evals/data/preference.jsonl: 300 + 60 pairs, regenerated byte for byte by tools/make_preference_set.py."""
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location(
        "make_preference_set", root / "tools" / "make_preference_set.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.OUT = tmp_path / "preference.jsonl"
    module.main()
    assert module.OUT.read_bytes() == (root / "evals" / "data" / "preference.jsonl").read_bytes()
    rows = [json.loads(line) for line in module.OUT.read_text().splitlines()]
    assert [r["split"] for r in rows].count("val") == 60 and len(rows) == 360
    train_q = {r["prompt"] for r in rows if r["split"] == "train"}
    assert not train_q & {r["prompt"] for r in rows if r["split"] == "val"}  # held-out questions are new
