"""Schemathesis against a live ``gptlab serve``: its command line found or the test skipped, and one run
with every check on (the fuzzing tests of the decoder's and the encoder's servers)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

KEY = "bench-key"  # the key bench/serve_robustness.py serves with


def schemathesis_cli() -> str:
    found = shutil.which("st", path=str(Path(sys.executable).parent)) or shutil.which("st")
    if found is None:
        pytest.skip("schemathesis is not installed (pip install -e '.[dev]')")
    return found


def fuzz(url: str, workdir: Path, *args: str) -> tuple[int, str]:
    """``st run`` with every check → (cases generated, its output); fails the test on any failure."""
    cmd = [
        schemathesis_cli(),
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "-H",
        f"Authorization: Bearer {KEY}",
    ]
    cmd += ["-w", "1", "--request-timeout", "30", "--generation-database", "none", "--no-color", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=workdir)  # its files go there
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-6000:]
    generated = re.search(r"(\d+) generated", out)
    assert generated is not None, out[-2000:]
    return int(generated.group(1)), out
