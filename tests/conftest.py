"""Shared fixtures.

Tests that need ``../shared/data`` use the ``shared_data`` fixture. Where the
folder is absent they skip with the reason; with ``GPTLAB_REQUIRE_SHARED=1`` (CI
sets it) they fail instead, so CI can never pass by skipping them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests import ROOT
from tests._tiny import ALPHABET
from tests._tiny import tiny_model as _tiny_model

# Tests use tiny models: one thread each is fastest, and it keeps parallel workers
# (pytest -n 2) and the subprocesses tests start from oversubscribing the cores.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")


def pytest_configure(config: pytest.Config) -> None:
    try:
        import torch
    except ImportError:  # the tokenizer tests run without torch
        return
    torch.set_num_threads(1)


SHARED_DATA = ROOT.parent / "shared" / "data"


def require_shared(*relative: str) -> Path:
    """Return ``SHARED_DATA/relative`` or skip (fail under GPTLAB_REQUIRE_SHARED=1)."""
    path = SHARED_DATA.joinpath(*relative)
    if not path.exists():
        reason = f"{path} is absent (the ../shared folder beside the project holds it)"
        if os.environ.get("GPTLAB_REQUIRE_SHARED") == "1":
            pytest.fail(f"GPTLAB_REQUIRE_SHARED=1 but {reason}")
        pytest.skip(reason)
    return path


@pytest.fixture
def shared_data() -> Path:
    """The ``../shared/data`` folder."""
    return require_shared()


@pytest.fixture
def shakespeare_path() -> Path:
    return require_shared("tinyshakespeare.txt")


@pytest.fixture
def gpt2_files() -> tuple[Path, Path]:
    """``(vocab.bpe, encoder.json)`` of GPT-2."""
    return require_shared("gpt2", "vocab.bpe"), require_shared("gpt2", "encoder.json")


@pytest.fixture(scope="session")
def tiny_model():
    """The factory ``tiny_model(seed=0, jitter=0.0, **overrides)`` → a seeded float32 GPT in eval mode
    (``tests/_tiny.py``); session-scoped, so module-scoped fixtures can take it too."""
    return _tiny_model


@pytest.fixture(scope="session")
def char_tok():
    """A character tokenizer over ``ALPHABET`` (letters, space, newline, ``:.,!?``), no special tokens."""
    from gptlab.tokenizers import CharTokenizer

    return CharTokenizer.from_text(ALPHABET)


@pytest.fixture(scope="session", autouse=True)
def _own_compile_cache(tmp_path_factory):
    """The CLI keeps compiled decode steps in ``$XDG_CACHE_HOME/gptlab/compiled``: a test run uses its
    own, so it neither loads a step another run compiled nor fills the user's cache."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("xdg-cache")))
        # no command of a test starts a background compilation (tests/cli/test_compile_later.py does)
        mp.setenv("GPTLAB_BACKGROUND_COMPILE", "0")
        yield


@pytest.fixture(params=["compiled", "library"])
def one_row(request, monkeypatch):
    """Each CPU's way of multiplying a decode step's one row (``gptlab.hardware.one_row_kernel``), on any
    machine: ``compiled`` (below native bf16) and ``library`` (with it); the name is the parameter."""
    from gptlab import hardware

    monkeypatch.setattr(hardware, "one_row_kernel", lambda device, machine=None: request.param)
    return request.param


@pytest.fixture
def compiled_one_row(monkeypatch):
    """The compiled one-row kernel, as a CPU without native bf16 takes it, on any machine."""
    from gptlab import hardware

    monkeypatch.setattr(hardware, "one_row_kernel", lambda device, machine=None: "compiled")
