"""``gptlab.data.pieces`` (a corpus cut into pieces any process reads alone), ``ShardWriter``'s hashes
as written and after a cut, and the worker pool's errors and start methods."""

from __future__ import annotations

import hashlib
import json
import random

import numpy as np
import pytest

from gptlab.cli import main
from gptlab.data import prepare, workers
from gptlab.data.pieces import plan_pieces, read_piece
from gptlab.data.shards import ShardWriter, read_tokens
from gptlab.errors import GptlabError

C = 64  # bytes per block in these tests


def _lines(seed: int, n: int) -> list[str]:
    rng = random.Random(seed)
    words = ["a", "ünï", "✓✓", "word", "𝄞", "  ", "longer-word"]
    out = []
    for _ in range(n):
        length = rng.choice([0, 1, 3, 10, 40])  # some lines far longer than a block
        out.append(" ".join(rng.choice(words) for _ in range(length)))
    return out


def test_text_pieces_cover_the_file_and_end_after_the_last_newline_of_their_block(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("\n".join(_lines(0, 300)) + "tail without newline", encoding="utf-8")
    raw = path.read_bytes()
    pieces = list(plan_pieces([path], C))
    assert len(pieces) == -(-len(raw) // C)
    order = list(range(len(pieces)))
    random.Random(1).shuffle(order)  # each piece is read alone, in any order, as a worker would
    read = {k: read_piece(pieces[k]) for k in order}
    texts = [t for k in range(len(pieces)) for _, t, _ in read[k]]
    assert "".join(texts) == raw.decode("utf-8")
    assert [s for k in range(len(pieces)) for s, _, _ in read[k]] == [True] + [False] * (len(texts) - 1)
    end = 0
    for k in range(len(pieces) - 1):
        end += sum(n for _, _, n in read[k])
        block = raw[k * C : (k + 1) * C]
        if b"\n" in block:  # cut right after the block's last newline
            assert end == k * C + block.rindex(b"\n") + 1
        else:  # a long line: cut at a character boundary at most 3 bytes before the block's end
            assert (k + 1) * C - 3 <= end <= (k + 1) * C and (raw[end] & 0xC0) != 0x80
    assert max(n for k in read for _, _, n in read[k]) < 2 * C + 4


def test_jsonl_pieces_are_whole_records_even_when_longer_than_a_block(tmp_path):
    docs = [line or "x" for line in _lines(2, 200)]
    path = tmp_path / "d.jsonl"
    path.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs) + "\n\n", encoding="utf-8")
    pieces = list(plan_pieces([path], C))
    got = [read_piece(p) for p in pieces]
    assert [t for g in got for _, t, _ in g] == docs
    assert all(s for g in got for s, _, _ in g)  # every record starts a document
    assert any(not g for g in got[:-1])  # a record across several blocks leaves empty pieces before it
    assert [n for g in got for _, _, n in g] == [len(d.encode()) for d in docs]


def test_errors_name_the_byte_offset_or_line_in_a_late_piece(tmp_path, monkeypatch, capsys):
    from gptlab.data import sources

    monkeypatch.setattr(sources, "CHUNK_BYTES", C)
    good = "".join(f"good line {i}\n" for i in range(100)).encode()
    (tmp_path / "nul.txt").write_bytes(good + b"bad\0byte\n" + good)
    (tmp_path / "latin.txt").write_bytes(good + b"caf\xe9\n" + good)
    (tmp_path / "bad.jsonl").write_text(
        "".join(json.dumps({"text": f"record {i}"}) + "\n" for i in range(50)) + "{not json\n"
    )
    cases = [
        ("nul.txt", f"NUL byte at offset {len(good) + 3}"),
        ("latin.txt", f"invalid byte at offset {len(good) + 3}"),
        ("bad.jsonl", "line 51 is not valid JSON"),
    ]
    for name, match in cases:
        for n in (1, 2):
            with pytest.raises(GptlabError, match=match):
                prepare([tmp_path / name], tmp_path / f"out-{n}", block_size=4, workers=n)
            assert not (tmp_path / f"out-{n}").exists()
        code = main(["prepare", str(tmp_path / name), "--out", str(tmp_path / "o"), "--workers", "2"])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and match in err[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.jsonl", "latin.txt", "nul.txt"]


@pytest.mark.parametrize("shard_tokens", [0, 50])
def test_shard_hashes_as_written_and_after_truncation_match_the_files(tmp_path, monkeypatch, shard_tokens):
    from gptlab.data import shards

    monkeypatch.setattr(shards, "MARK_TOKENS", 7)  # many kept hash states: the cut re-hashes from one
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 60000, size=333).astype(np.uint16)
    for keep in (333, 300, 151, 150, 5):
        d = tmp_path / f"{keep}"
        d.mkdir()
        w = ShardWriter(d, "train", np.dtype(np.uint16), shard_tokens)
        for i in range(0, 333, 13):
            w.write(tokens[i : i + 13])
        entries = w.close()
        assert np.array_equal(read_tokens(d, entries, np.dtype(np.uint16), 40, 260), tokens[40:260])
        for entry in w.truncate(keep) if keep < 333 else entries:
            assert entry["sha256"] == hashlib.sha256((d / entry["file"]).read_bytes()).hexdigest()
        kept = np.concatenate([np.fromfile(p, dtype=np.uint16) for p in sorted(d.glob("*.bin"))])
        assert np.array_equal(kept, tokens[:keep])


def test_spawned_workers_give_the_same_bytes(tmp_path, monkeypatch):
    from gptlab.data import sources

    monkeypatch.setattr(sources, "CHUNK_BYTES", 512)
    (tmp_path / "c.txt").write_text("".join(f"line {i}: ünï ✓\n" for i in range(600)))
    prepare([tmp_path / "c.txt"], tmp_path / "fork", tokenizer="bpe:300", block_size=8, workers=2)
    monkeypatch.setattr(workers, "FORK", False)  # as on macOS and Windows: workers load tokenizer.json
    prepare([tmp_path / "c.txt"], tmp_path / "spawn", tokenizer="bpe:300", block_size=8, workers=2)
    for name in ("train.bin", "val.bin", "meta.json", "tokenizer.json"):
        assert (tmp_path / "fork" / name).read_bytes() == (tmp_path / "spawn" / name).read_bytes()
