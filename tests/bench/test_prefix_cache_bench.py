"""``bench/prefix_cache.py`` runs and prints its one JSON line; its memory figure stays within the budget."""

from __future__ import annotations

import json
import subprocess
import sys

from tests import ROOT


def test_the_prefix_cache_benchmark_prints_one_json_line_within_its_budget():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "prefix_cache.py"), "--prefix", "40", "--runs", "1",
         "--reply", "4", "--requests", "8", "--budget-mb", "0.25", "--threads", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = done.stdout.strip().splitlines()
    result = json.loads(line)
    assert result["bench"] == "prefix_cache" and result["ttft"]["warm_ms"] > 0
    assert result["chat"]["reused_tokens"] > 0  # turns 2–5 reuse the conversation so far
    memory = result["memory"]
    assert memory["within_budget"] and 0 < memory["peak_cache_mb"] <= 0.25 and memory["evictions"] > 0
