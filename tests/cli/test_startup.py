"""``gptlab.cli.startup``: a command that loads a model starts with the cyclic collector paused, runs
with it on once the model is loaded, and leaves the collector as it found it (nothing left frozen)."""

from __future__ import annotations

import gc

import pytest

import gptlab
from gptlab.cli import main, startup
from gptlab.tokenizers import CharTokenizer


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_model):
    tok = CharTokenizer.from_text("abcdefgh ij\n", special_tokens=["<|endoftext|>"])
    model = tiny_model(vocab_size=tok.vocab_size, n_layer=1, n_head=2, n_embd=16)
    return gptlab.save(model, tok, tmp_path_factory.mktemp("ckpt") / "c")


@pytest.fixture
def collector():
    """The collector on and nothing frozen before the test, and again after it whatever happened."""
    gc.enable()
    assert gc.get_freeze_count() == 0
    yield
    gc.unfreeze()
    gc.enable()


def _recording(seen: list[tuple[str, bool, bool]], what: str, fn):
    def wrapped(*args, **kwargs):
        seen.append((what, gc.isenabled(), gc.get_freeze_count() > 0))
        return fn(*args, **kwargs)

    return wrapped


def test_sample_loads_paused_then_decodes_with_the_collector_on(ckpt, monkeypatch, capsys, collector):
    from gptlab.cli import sample

    seen: list[tuple[str, bool, bool]] = []
    monkeypatch.setattr(gptlab, "load", _recording(seen, "load", gptlab.load))
    monkeypatch.setattr(sample, "prepare_decode", _recording(seen, "decode", sample.prepare_decode))
    assert main(["sample", str(ckpt), "--prompt", "abc", "--max-new-tokens", "4", "--temperature", "0"]) == 0
    # while loading: off, nothing frozen yet; decoding: on, what the start built frozen
    assert seen == [("load", False, False), ("decode", True, True)]
    assert gc.isenabled() and gc.get_freeze_count() == 0  # as it was
    assert capsys.readouterr().out.startswith("abc")


def test_serve_serves_with_the_collector_on(ckpt, monkeypatch, capsys, collector):
    import uvicorn

    from gptlab.serve import launch

    seen: list[tuple[str, bool, bool]] = []
    monkeypatch.setattr(launch, "load_for_serving", _recording(seen, "load", launch.load_for_serving))
    monkeypatch.setattr(uvicorn, "run", _recording(seen, "serve", lambda *a, **k: None))
    assert main(["serve", str(ckpt), "--port", "0"]) == 0
    assert seen == [("load", False, False), ("serve", True, True)]
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_command_that_loads_no_model_runs_with_the_collector_on(monkeypatch, capsys, collector):
    from gptlab.cli import size

    seen: list[tuple[str, bool, bool]] = []
    monkeypatch.setattr(size, "run", _recording(seen, "size", size.run))
    assert main(["size", "--preset", "gpt2"]) == 0
    assert [s[:2] for s in seen] == [("size", True)]
    assert gc.isenabled() and gc.get_freeze_count() == 0


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_left_as_the_caller_had_it_after_an_error(tmp_path, capsys, collector, enabled):
    if not enabled:
        gc.disable()
    assert main(["sample", str(tmp_path / "missing"), "--prompt", "a"]) == 2
    assert capsys.readouterr().err.startswith("error:")
    assert gc.isenabled() is enabled and gc.get_freeze_count() == 0


def test_the_gptlab_command_ends_with_what_its_start_built_still_frozen(ckpt, capsys, collector):
    """``gptlab`` and ``python -m gptlab`` run ``entry``: the process ends with the command, so the
    frozen objects stay frozen and the interpreter's last collection skips them; ``main`` called in a
    process that goes on gives them back."""
    import tomllib
    from pathlib import Path

    from gptlab.cli import entry

    argv = ["sample", str(ckpt), "--prompt", "abc", "--max-new-tokens", "2"]
    assert main(argv, exiting=True) == 0
    assert gc.isenabled() and gc.get_freeze_count() > 0
    startup.resume()  # (this process goes on: give them back)
    assert gc.get_freeze_count() == 0
    root = Path(__file__).resolve().parents[2]
    scripts = tomllib.loads((root / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["gptlab"] == "gptlab.cli:entry"
    assert "SystemExit(entry())" in (root / "src" / "gptlab" / "__main__.py").read_text()
    assert entry.__module__ == "gptlab.cli"
