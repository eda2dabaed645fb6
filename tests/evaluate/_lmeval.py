"""What the lm-evaluation-harness tests share: the offline tasks of ``evals/``, the tiny model's
end-of-text token and context, skipping where the ``eval`` extra is absent, and a task's samples."""

from __future__ import annotations

import importlib.util
import os

import pytest

from tests import ROOT

EVALS = ROOT / "evals"
TASKS = ["gptlab_choice", "gptlab_rolling", "gptlab_gen"]
EOT = "<|endoftext|>"
BLOCK = 64


def require(*modules: str) -> None:
    """Skip where the ``eval`` extra's packages are absent; fail instead under GPTLAB_REQUIRE_SHARED=1."""
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        reason = f"{', '.join(missing)} not installed (pip install 'gptlab[eval]')"
        if os.environ.get("GPTLAB_REQUIRE_SHARED") == "1":
            pytest.fail(f"GPTLAB_REQUIRE_SHARED=1 but {reason}")
        pytest.skip(reason)


def samples(results: dict, task: str) -> list[dict]:
    """lm-eval's logged samples of ``task``, in document order."""
    return sorted(results["samples"][task], key=lambda s: s["doc_id"])
