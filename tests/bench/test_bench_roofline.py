"""``bench/roofline.py``: the least time a recipe's step can take on this CPU, and what 2× would need."""

from __future__ import annotations

import json
import time

import pytest

from bench import roofline


def test_rates_count_the_flops_of_the_products():
    # 2·m·k·n FLOPs per product, divided by the time: a positive, finite rate for each precision
    import torch

    assert roofline.square_gflops(torch.float32, (64,), 2) > 0.01
    assert roofline.shapes_gflops([(16, 32, 8), (16, 8, 32)], torch.float32, 2) > 0.001
    calls = []
    assert roofline.median_s(lambda: calls.append(1), 4) >= 0 and len(calls) == 5  # one warm-up, four timed
    slow = []  # a call of 0.05 s with a budget of 0.1 s: three timed calls, not ten
    assert roofline.median_s(lambda: slow.append(time.sleep(0.05)), 10, budget_s=0.1) >= 0.05
    assert len(slow) == 4


def test_prints_one_json_line_whose_bounds_follow_from_its_figures(shakespeare_path, tmp_path, capsys):
    text = tmp_path / "shakespeare-40k.txt"
    text.write_text(shakespeare_path.read_text(encoding="utf-8")[:40_000], encoding="utf-8")
    argv = ["--data", str(text), "--repeats", "2", "--sizes", "128", "--yardstick-steps", "24"]
    argv += ["--threads", "1"]
    assert roofline.main(argv) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1
    row = json.loads(lines[0])
    # reference: 4 layers, d 128, context 64, batch 12, 65 characters → 3·(2·N + 2·L·T·d)·B·T, N: the
    # blocks' matrices, their biases (3d + d + 4d + d) and LayerNorms (2·2d), the final LayerNorm, the head
    n = 4 * (3 * 128 * 128 + 128 * 128 + 2 * 4 * 128 * 128 + 9 * 128 + 4 * 128) + 2 * 128 + 65 * 128
    assert row["train_gflop_per_step"] == pytest.approx(
        3 * (2 * n + 2 * 4 * 64 * 128) * 12 * 64 / 1e9, abs=1e-3
    )
    flops, peak, step_ms = row["train_gflop_per_step"] * 1e9, row["peak_gflops"] * 1e9, row["yardstick_ms"]
    # every figure carries 4 significant digits (±0.05 %), so figures derived from printed ones agree to
    # a few parts in a thousand however small they are (two decimals made 0.0873 print as 0.09: 3 % off)
    assert row["floor_ms"] == pytest.approx(1000 * flops / peak, rel=3e-3)
    assert row["max_speedup"] == pytest.approx(step_ms / row["floor_ms"], rel=3e-3)
    assert row["share_of_peak_2x"] == pytest.approx(2 / row["max_speedup"], rel=3e-3)
    assert row["yardstick_gflops"] == pytest.approx(flops / step_ms / 1e6, rel=3e-3)


def test_figures_keep_their_precision_when_small():
    # the ratio that failed the test under AVX2 imitation: 0.0873, which two decimals printed as 0.09
    assert roofline.significant(0.087321) == 0.08732
    assert roofline.significant(2 / 0.087321) == pytest.approx(2 / 0.087321, rel=5e-4)
    assert roofline.significant(12345.678) == 12350.0
