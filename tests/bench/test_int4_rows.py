"""``bench/int4_rows.py``: the int4 kernel against dequantising, per row count and shape, and per shape
the smallest row count at which dequantising was the faster."""

from __future__ import annotations

import pytest

from gptlab.model.int4 import int4_supported

pytestmark = pytest.mark.skipif(not int4_supported(16, 32), reason="this torch has no CPU int4 kernel")


def test_one_line_with_both_ways_per_row_count(capsys):
    from bench import int4_rows

    result = int4_rows.main(["--rows", "1,4", "--shapes", "64x64,32x96", "--rounds", "1", "--calls", "2"])
    assert result["bench"] == "int4_rows" and set(result["shapes"]) == {"64x64", "32x96"}
    for line in result["shapes"].values():
        assert set(line) == {"1", "4"}
        assert all(v["kernel_ms"] > 0 and v["dequantised_ms"] > 0 for v in line.values())
    wins = {
        shape: min((int(m) for m, v in line.items() if v["dequantised_ms"] < v["kernel_ms"]), default=None)
        for shape, line in result["shapes"].items()
    }
    assert result["dequantised_faster_from"] == wins
    assert capsys.readouterr().out.count("\n") == 1


@pytest.mark.slow  # two torch.compile calls
def test_dequantise_times_four_ways_that_agree(capsys):
    """``--dequantise``: the eager and the compiled-graph dequantisations, each eager and compiled, per
    shape; the bench stops if any two give different weights."""
    from bench import int4_rows

    result = int4_rows.main(["--dequantise", "--shapes", "128x64", "--rounds", "1", "--calls", "2"])
    assert result["dequantise"] and set(result["shapes"]) == {"128x64"}
    ways = result["shapes"]["128x64"]
    assert set(ways) == {f"{w}_{how}_ms" for w in ("groups", "blocks") for how in ("eager", "compiled")}
    assert all(ms > 0 for ms in ways.values())
    assert capsys.readouterr().out.count("\n") == 1
