"""``--compile auto`` never waits for a compilation: where the compile cache lacks the one-row step, a
command decodes layer by layer and starts ``gptlab compile`` in the background, once; the next command
loads the step and decodes compiled from its first token (``gptlab.cli.compile``).

The background process is recorded, not run, except in the slow test, which runs ``gptlab compile``
for real and then a command that loads what it kept.
"""

from __future__ import annotations

import io
import json
import os
import string
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import gptlab
from gptlab.cli import background, main
from gptlab.cli import compile as compile_cli
from gptlab.compiling import can_compile
from gptlab.tokenizers import CharTokenizer

ROOT = Path(__file__).resolve().parents[2]
TEXT = "abcdefgh ij\n"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tiny_model):
    tok = CharTokenizer.from_text(TEXT, special_tokens=["<|endoftext|>"])
    model = tiny_model(vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=32, pos="rope", norm="rmsnorm")
    return gptlab.save(model, tok, tmp_path_factory.mktemp("ckpt") / "c")


@pytest.fixture
def as_large(monkeypatch):
    """The tiny model treated as one whose step gains from compiling, on a CPU with a compiler;
    background compilation on (the test suite's default is off)."""
    monkeypatch.setattr("gptlab.generate.plan.STREAM_MIN_BYTES", 0)
    monkeypatch.setattr("gptlab.generate.plan.compile_blocker", lambda device: None)
    monkeypatch.setenv("GPTLAB_BACKGROUND_COMPILE", "1")


@pytest.fixture
def started(monkeypatch):
    """``gptlab.cli.background.start`` recorded instead of run; the pid it gives is a live process (ours)."""
    commands: list[list[str]] = []

    def start(command, log):
        commands.append(command)
        assert log.parent.is_dir()
        return os.getpid()

    monkeypatch.setattr(background, "start", start)
    return commands


def _sample(ckpt, store, *extra):
    args = ["sample", str(ckpt), "--prompt", "abc", "--max-new-tokens", "6", "--temperature", "0"]
    return main([*args, "--compile-cache", str(store), *extra])


def test_a_command_starts_one_background_compilation_and_decodes_layer_by_layer(
    ckpt, tmp_path, as_large, started, capsys
):
    store = tmp_path / "compiled"
    assert _sample(ckpt, store, "--verbose") == 0
    err = capsys.readouterr().err
    assert "compile: off (not compiled here" in err and "compiling it for later processes" in err
    assert "decode plan (cpu, batch 1): dynamic cache, layer by layer" in err  # the plan that ran
    (command,) = started
    assert command[:5] == [sys.executable, "-m", "gptlab", "compile", str(ckpt)]
    options = dict(zip(command[5::2], command[6::2], strict=False))
    assert options["--threads"] == str(torch.get_num_threads()) and options["--compile-cache"] == str(store)
    assert options["--dtype"] in ("fp32", "bf16") and command[-1] == "--background"
    (folder,) = store.iterdir()
    assert json.loads((folder / background.BUILDING).read_text())["pid"] == os.getpid()
    # a second command while that process lives starts none, and says why
    assert _sample(ckpt, store) == 0
    assert len(started) == 1 and f"being compiled for later processes by process {os.getpid()}" in (
        capsys.readouterr().err
    )
    # its process gone (a pid that is no process), the claim is stale: the next command starts one
    (folder / background.BUILDING).write_text(json.dumps({"pid": 2**22 + 7, "at": 0}))
    assert _sample(ckpt, store) == 0
    assert len(started) == 2


def test_a_failed_compilation_is_not_tried_again_and_off_starts_nothing(
    ckpt, tmp_path, as_large, started, capsys
):
    store = tmp_path / "compiled"
    assert _sample(ckpt, store, "--background-compile", "off") == 0
    assert started == [] and not store.exists()
    assert _sample(ckpt, store, "--compile", "off") == 0
    assert started == []
    assert _sample(ckpt, store) == 0
    (folder,) = store.iterdir()
    (folder / background.BUILDING).unlink()
    (folder / background.FAILED).write_text(json.dumps({"why": "export: an op it cannot take"}))
    capsys.readouterr()
    assert _sample(ckpt, store) == 0
    assert len(started) == 1  # not again
    assert "an earlier try failed (export: an op it cannot take" in capsys.readouterr().err
    (folder / background.FAILED).write_text("{not json")
    assert _sample(ckpt, store) == 0
    assert len(started) == 1 and "its record is unreadable" in capsys.readouterr().err


def test_the_background_compile_records_why_it_failed(ckpt, tmp_path, monkeypatch, capsys):
    """``gptlab compile --background`` where no step compiles (compiling switched off) leaves a
    ``failed.json`` that later commands read; in the foreground the same is one error line."""
    monkeypatch.setattr(compile_cli, "_lowest_priority", lambda: None)  # (this is the test's process)
    monkeypatch.setenv("GPTLAB_COMPILE", "0")
    store = tmp_path / "compiled"
    assert main(["compile", str(ckpt), "--compile-cache", str(store)]) == 2
    assert "error: no compiled one-row step for this model here" in capsys.readouterr().err
    assert main(["compile", str(ckpt), "--compile-cache", str(store), "--background"]) == 2
    (folder,) = store.iterdir()
    assert "compiling switched off" in json.loads((folder / background.FAILED).read_text())["why"]
    assert main(["compile", str(ckpt), "--compile-cache", "none"]) == 2
    assert "needs a --compile-cache folder" in capsys.readouterr().err


@pytest.mark.slow  # an ahead-of-time compilation of the tiny step: 20-100 s on 2 cores
@pytest.mark.skipif(not can_compile("cpu"), reason="no C++ compiler for torch.compile")
def test_what_gptlab_compile_keeps_the_next_command_loads(ckpt, tmp_path, as_large, capsys):
    """What ``gptlab compile`` keeps, the next command loads; and neither command leaves the folder
    AOTInductor unpacks the package into behind, even one that ends without running its exit handlers
    as a killed one does (a command ends with its objects unfinalised, so the loader that would remove
    it is never destroyed: ~4 MB of the system's temporary directory for every command, before
    ``gptlab.compiling.load_package``)."""
    store, temp = tmp_path / "compiled", tmp_path / "temp"
    temp.mkdir()
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), TMPDIR=str(temp))
    run = subprocess.run(
        [sys.executable, "-m", "gptlab", "compile", str(ckpt), "--compile-cache", str(store)]
        + ["--threads", str(torch.get_num_threads()), "--dtype", "fp32"],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
        cwd=ROOT,
    )
    assert run.returncode == 0, run.stderr
    assert "kept in" in run.stderr
    command = (  # the sample ends as a killed process does: no exit handler runs (nor would after SIGKILL)
        "import os, sys, gptlab.generate.plan as p; p.STREAM_MIN_BYTES = 0; from gptlab.cli import entry; "
        "code = entry(); sys.stdout.flush(); sys.stderr.flush(); os._exit(code)"
    )
    args = ["sample", str(ckpt), "--prompt", "abc", "--max-new-tokens", "6", "--temperature", "0"]
    args += ["--compile-cache", str(store), "--dtype", "fp32", "--verbose"]
    run = subprocess.run(
        [sys.executable, "-c", command, *args], capture_output=True, text=True, env=env, timeout=600, cwd=ROOT
    )
    assert run.returncode == 0 and "loaded from" in run.stderr, run.stderr
    assert list(temp.glob("aotinductor_*")) == []  # unpacked by both processes, removed once loaded
    assert _sample(ckpt, store, "--compile", "off", "--dtype", "fp32") == 0
    eager = capsys.readouterr().out
    assert _sample(ckpt, store, "--verbose", "--dtype", "fp32") == 0
    out, err = capsys.readouterr()
    assert "compile: on (its compiled step is kept for this model and machine" in err
    assert "one-row step ran: compiled 5 (loaded from" in err  # every step through the loaded package
    assert out == eager  # greedy: the same text


def test_a_compile_cache_that_cannot_be_written_costs_a_note_never_the_command(
    ckpt, tmp_path, as_large, started, capsys
):
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert _sample(ckpt, blocked / "compiled") == 0  # (no folder can be made under a file)
    out, err = capsys.readouterr()
    assert out.startswith("abc") and started == []
    assert "not compiled for later processes: NotADirectoryError" in err


class _Questions(io.StringIO):
    """Standard input with a question a line; ``between()`` runs before every line after the first
    (after the answer before it)."""

    def __init__(self, lines: list[str], between) -> None:
        super().__init__("".join(f"{line}\n" for line in lines))
        self.asked, self.between = 0, between

    def readline(self, *args) -> str:  # type: ignore[override]
        if self.asked:
            self.between()
        self.asked += 1
        return super().readline(*args)


def test_a_chat_takes_up_the_step_a_background_compile_kept_during_it(
    tmp_path, tiny_model, as_large, started, monkeypatch, capsys
):
    """A chat that began layer by layer (its step compiling in the background) answers through the
    one-row step from the first question after the step is kept, says so on one line, and gives the
    answer the layer-by-layer chat gives."""
    from gptlab.cli import chat
    from tests._kept import keep_a_recording_step

    engines = []

    def prepare_decode(*args, **kwargs):
        engines.append(chat_prepare(*args, **kwargs))
        return engines[-1]

    tok = CharTokenizer.from_text(string.printable, special_tokens=["<|endoftext|>"])  # the template's text
    model = tiny_model(vocab_size=tok.vocab_size, n_layer=2, n_head=4, n_embd=32, pos="rope", norm="rmsnorm")
    ckpt = gptlab.save(model, tok, tmp_path / "c")
    chat_prepare = chat.prepare_decode
    monkeypatch.setattr(chat, "prepare_decode", prepare_decode)
    store = tmp_path / "compiled"
    calls: list[list[int]] = []
    kept = lambda: calls or calls.append(keep_a_recording_step(engines[-1].model, store))  # noqa: E731
    questions = ["abc", "ab", "a"]
    args = ["chat", str(ckpt), "--compile-cache", str(store), "--max-new-tokens", "6", "--temperature", "0"]
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(f"{q}\n" for q in questions)))
    assert main([*args, "--compile", "off"]) == 0
    layer_by_layer = capsys.readouterr().out
    monkeypatch.setattr("sys.stdin", _Questions(questions, kept))
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "compile: off (not compiled here" in err and len(started) == 1
    assert (
        err.count("compile: on from this answer (its compiled step is kept for this model and machine") == 1
    )
    assert calls[0] and set(calls[0]) == {1}  # the later answers' steps, one row each
    assert out == layer_by_layer  # greedy: the same answers
