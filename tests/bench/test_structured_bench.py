"""``bench/structured.py``: one JSON line whose ratios follow from its times, every request run to its length."""

from __future__ import annotations

import json

import pytest

from bench import structured


def test_prints_one_json_line_of_consistent_figures(capsys):
    assert structured.main(["--tokens", "6", "--runs", "1", "--threads", "1"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    ms = row["ms_per_token"]
    assert set(ms) == {"b1_free", "b1_json", "b8_free", "b8_mixed", "b8_json"} and min(ms.values()) > 0
    assert row["ratio_b1"] == pytest.approx(ms["b1_json"] / ms["b1_free"], rel=0.01)
    assert row["ratio_b8_all"] == pytest.approx(ms["b8_json"] / ms["b8_free"], rel=0.01)
    assert 0 < row["engine_ms_per_token"] and row["model"] == "demo"
