"""``bench/serve_scheduler.py`` runs and prints its one JSON line (the figure itself is a benchmark's, not a test's)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests import ROOT


def test_the_scheduler_benchmark_finishes_every_job_and_prints_one_json_line():
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "serve_scheduler.py"), "--jobs", "6", "--tokens", "5", "--runs", "2",
         "--max-batch", "4", "--threads", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (line,) = done.stdout.strip().splitlines()
    result = json.loads(line)
    assert result["bench"] == "serve_scheduler" and result["jobs"] == 6 and len(result["runs"]) == 2
    assert result["tokens_per_s"] > 0 and all(r > 0 for r in result["runs"])
