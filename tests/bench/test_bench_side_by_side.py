"""``bench/side_by_side.py``: a recipe and the nanoGPT-style yardstick trained in turns in one process."""

from __future__ import annotations

import json

from bench import side_by_side


def test_trains_both_sides_in_turns_and_prints_one_json_line(shakespeare_path, tmp_path, capsys, monkeypatch):
    assert side_by_side.cuts(900, 4) == [0, 225, 450, 675, 900]
    assert side_by_side.cuts(5, 3) == [0, 2, 3, 5]
    text = tmp_path / "shakespeare-40k.txt"  # both sides take their vocabulary from this file
    text.write_text(shakespeare_path.read_text(encoding="utf-8")[:40_000], encoding="utf-8")
    argv = ["--data", str(text), "--blocks", "3", "--baseline-steps", "5"]
    assert side_by_side.main([*argv, "max_steps=4", "eval_batches=1", "threads=1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    assert row["steps"] == 4 and row["baseline_steps"] == 5 and row["blocks"] == 3
    assert row["train_s"] > 0 and row["baseline_train_s"] > 0
    ours, base = row["train_s"], row["baseline_train_s"]  # each rounded to 0.01 s
    assert (
        (ours - 0.005) / (base + 0.005) - 1e-3 <= row["time_ratio"] <= (ours + 0.005) / (base - 0.005) + 1e-3
    )
    assert 1.0 < row["val_loss"] < 5.0 and 1.0 < row["baseline_last_loss"] < 5.0
