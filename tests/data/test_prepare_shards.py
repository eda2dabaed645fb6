"""``gptlab prepare --workers N --shard-tokens M``: same bytes for any N, shards read as one array, parquet,
and one-line errors for bad input."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from gptlab.cli import main
from gptlab.data import TokenDataset, WindowSampler, eval_batches, prepare
from gptlab.data.corpus import sha256_file
from gptlab.data.shards import ShardedTokens
from gptlab.train import train
from gptlab.train.config import build_config
from tests._tiny import TINY_TRAIN


def _corpus(tmp_path, n_files: int = 3):
    folder = tmp_path / "corpus"
    folder.mkdir()
    for f in range(n_files):
        text = "".join(f"file {f} line {i}: ünïcode ✓ words {i * f % 17}\n" for i in range(400 + 50 * f))
        (folder / f"{f}.txt").write_text(text, encoding="utf-8")
    return folder


def _one_error_line(err: str) -> bool:
    """One ``error: …`` line (besides the run's ``hardware: …`` note), no traceback."""
    lines = [line for line in err.splitlines() if not line.startswith("hardware: ")]
    return len(lines) == 1 and lines[0].startswith("error: ")


def _files(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture
def small_chunks(monkeypatch):
    """1 KB pieces: many pieces per file, several in flight in the pool at once."""
    from gptlab.data import sources

    monkeypatch.setattr(sources, "CHUNK_BYTES", 1024)


def test_workers_give_byte_identical_shards(tmp_path, small_chunks):
    folder = _corpus(tmp_path)
    docs = [f"short document {i} " * (i % 9 + 1) for i in range(300)]  # many small documents
    docs[40] = "a record longer than a piece ✓ " * 150  # a JSONL line across several 1 KB blocks
    (folder / "long-lines.txt").write_text("no newline for a while ✓ " * 400 + "\nthen short lines\n" * 30)
    (folder / "docs.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    runs = {}
    for workers in (1, 2, 3):
        out = tmp_path / f"w{workers}"
        prepare([folder], out, tokenizer="bpe:300", block_size=8, workers=workers, shard_tokens=5000)
        runs[workers] = _files(out)
    assert runs[1] == runs[2] == runs[3]
    meta = json.loads(runs[1]["meta.json"])
    names = [e["file"] for e in meta["shards"]["train"]]
    assert names[0] == "train-00000.bin" and len(names) >= 3
    assert all(e["tokens"] <= 5000 for split in meta["shards"].values() for e in split)
    assert sum(e["tokens"] for e in meta["shards"]["train"]) == meta["train_tokens"]
    for e in meta["shards"]["train"] + meta["shards"]["val"]:
        assert e["sha256"] == sha256_file(tmp_path / "w1" / e["file"])
    # the shards hold exactly the tokens of the one-file layout
    prepare([folder], tmp_path / "flat", tokenizer="bpe:300", block_size=8)
    flat, shard = TokenDataset(tmp_path / "flat"), TokenDataset(tmp_path / "w2")
    assert isinstance(shard.split("train"), ShardedTokens)
    for split in ("train", "val"):
        assert np.array_equal(np.asarray(flat.split(split)), np.asarray(shard.split(split)))
    assert flat.meta["val_bytes"] == shard.meta["val_bytes"]


def test_sampler_reads_across_shards_exactly_as_one_file(tmp_path):
    folder = _corpus(tmp_path)
    prepare([folder], tmp_path / "flat", block_size=16)
    prepare([folder], tmp_path / "sh", block_size=16, shard_tokens=997)  # windows straddle shard ends
    flat, shard = TokenDataset(tmp_path / "flat").split("train"), TokenDataset(tmp_path / "sh").split("train")
    a, b = WindowSampler(flat, 16, 8, seed=3), WindowSampler(shard, 16, 8, seed=3)
    for step in (0, 1, 17, 500, 5000):  # several epochs: the position is still just the step
        for x, y in zip(a.batch(step), b.batch(step)):
            assert np.array_equal(x.numpy(), y.numpy())
    for (x1, y1), (x2, y2) in zip(eval_batches(flat, 16, 4), eval_batches(shard, 16, 4)):
        assert np.array_equal(x1.numpy(), x2.numpy()) and np.array_equal(y1.numpy(), y2.numpy())
    assert np.array_equal(shard[990:1010], np.asarray(flat)[990:1010])
    assert shard[-1] == flat[-1]


def test_old_single_file_datasets_still_load(tmp_path):
    folder = _corpus(tmp_path, 1)
    prepare([folder], tmp_path / "ds", block_size=8)
    meta = json.loads((tmp_path / "ds" / "meta.json").read_text())
    assert sorted(p.name for p in (tmp_path / "ds").glob("*.bin")) == ["train.bin", "val.bin"]
    old = {k: v for k, v in meta.items() if k not in ("shards", "shard_tokens")} | {"format": 1}
    (tmp_path / "ds" / "meta.json").write_text(json.dumps(old))
    ds = TokenDataset(tmp_path / "ds")
    assert len(ds.split("train")) == meta["train_tokens"]


def test_parquet_and_jsonl_give_the_same_documents(tmp_path):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is an optional dependency")
    import pyarrow.parquet as pq

    docs = [f"document {i}: {'lorem ipsum ' * (i % 5 + 1)}✓" for i in range(60)]
    pq.write_table(pa.table({"id": list(range(60)), "text": docs}), tmp_path / "c.parquet", row_group_size=7)
    (tmp_path / "c.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    a = prepare([tmp_path / "c.parquet"], tmp_path / "pq", block_size=8)
    b = prepare([tmp_path / "c.jsonl"], tmp_path / "jl", block_size=8)
    assert a["documents"] == b["documents"] == 60
    assert _files(tmp_path / "pq")["train.bin"] == _files(tmp_path / "jl")["train.bin"]


def test_bad_input_is_one_line(tmp_path, capsys, monkeypatch):
    pa = pytest.importorskip("pyarrow", reason="pyarrow is an optional dependency")
    import pyarrow.parquet as pq

    folder = _corpus(tmp_path, 1)
    os.symlink(tmp_path / "gone.txt", folder / "broken.txt")  # unreadable (as root, chmod 000 still reads)
    pq.write_table(pa.table({"body": ["x"]}), tmp_path / "notext.parquet")
    (tmp_path / "fake.parquet").write_bytes(b"not parquet at all")
    prepare([tmp_path / "corpus" / "0.txt"], tmp_path / "sh", block_size=8, shard_tokens=2000)
    shard = tmp_path / "sh" / "train-00001.bin"
    shard.write_bytes(shard.read_bytes()[:-6])
    cases = [
        (["prepare", folder, "--out", tmp_path / "o1"], "broken.txt: cannot be read"),
        (
            ["prepare", tmp_path / "notext.parquet", "--out", tmp_path / "o2"],
            "no 'text' column (columns: body)",
        ),
        (["prepare", tmp_path / "fake.parquet", "--out", tmp_path / "o3"], "not a readable parquet"),
        (["prepare", tmp_path / "corpus" / "0.txt", "--out", tmp_path / "o4", "--workers", "0"], "--workers"),
        (["train", "--data", tmp_path / "sh", "--out", tmp_path / "r"], "train-00001.bin: shard truncated"),
    ]
    for argv, match in cases:
        code = main([str(a) for a in argv])
        err = capsys.readouterr().err
        assert code == 2 and _one_error_line(err) and match in err, (argv, err)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # pyarrow not installed
    code = main(["prepare", str(tmp_path / "notext.parquet"), "--out", str(tmp_path / "o5")])
    assert code == 2 and "needs pyarrow" in capsys.readouterr().err


def test_resuming_on_a_different_dataset_is_one_line(tmp_path, capsys):
    (tmp_path / "a.txt").write_text("".join(f"alpha line {i}\n" for i in range(300)))
    (tmp_path / "b.txt").write_text("".join(f"bravo line {i}\n" for i in range(300)))
    prepare([tmp_path / "a.txt"], tmp_path / "a", block_size=16)
    prepare([tmp_path / "b.txt"], tmp_path / "b", block_size=16)
    train(build_config(None, [*TINY_TRAIN, "max_steps=2", "eval_every=2"]), tmp_path / "a", tmp_path / "run")
    code = main(
        ["train", "--out", str(tmp_path / "run"), "--resume", "--data", str(tmp_path / "b"), "max_steps=3"]
    )
    err = capsys.readouterr().err
    assert code == 2 and "different dataset" in err and _one_error_line(err)
    # the same tokens re-cut into shards are the same dataset: resuming on them is fine
    prepare([tmp_path / "a.txt"], tmp_path / "a2", block_size=16, shard_tokens=700)
    code = main(
        ["train", "--out", str(tmp_path / "run"), "--resume", "--data", str(tmp_path / "a2"), "max_steps=3"]
    )
    assert code == 0, capsys.readouterr().err


def test_prepare_with_a_saved_tokenizer_file_needs_no_torch(tmp_path):
    """``--tokenizer FILE`` (and ``char``) load no model, so no torch: start-up stays ~0.3 s, not ~2 s."""
    import subprocess

    corpus = _corpus(tmp_path, n_files=1)
    prepare([corpus], tmp_path / "first", tokenizer="char")
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from gptlab.cli import main\n"
        f"main(['prepare', {str(corpus)!r}, '--out', {str(tmp_path / 'again')!r}, "
        f"'--tokenizer', {str(tmp_path / 'first' / 'tokenizer.json')!r}, '--workers', '2'])"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr.strip().splitlines()[-1:]
    again, first = _files(tmp_path / "again"), _files(tmp_path / "first")
    assert again.pop("meta.json") and first.pop("meta.json")  # it names the tokenizer as given
    assert again == first
