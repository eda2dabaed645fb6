"""What a newcomer meets: every dead end ends in a working command or one line saying what to do."""

from __future__ import annotations

import shutil
import sys

import pytest

from gptlab import __version__
from gptlab import checkpoint as ckpt
from gptlab.checkpoint.integrity import write_checksums
from gptlab.cli import main
from gptlab.data import prepare
from gptlab.train.metrics import read_metrics
from tests._tiny import TINY_TRAIN

TINY = [*TINY_TRAIN, "batch_size=4", "eval_every=2"]


@pytest.fixture(scope="module")
def datasets(tmp_path_factory):
    """A small character dataset, and one of a text with many more characters (a larger tokenizer)."""
    root = tmp_path_factory.mktemp("newcomer")
    (root / "small.txt").write_text("\n".join(f"to be or not to be {i % 7}" for i in range(400)))
    (root / "large.txt").write_text("".join(chr(0x3B1 + i % 40) for i in range(4000)) + " abc")
    prepare([root / "small.txt"], root / "small", block_size=16)
    prepare([root / "large.txt"], root / "large", block_size=16)
    return root / "small", root / "large"


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _one_error_line(code: int, err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    return lines[0]


def test_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.startswith(f"gptlab {__version__} ")


def test_a_flag_that_names_a_setting_says_which_key_value_to_write(capsys, datasets, tmp_path):
    small, _ = datasets
    base = ["train", "--data", small, "--out", tmp_path / "r"]
    for flags, hint in [
        (["--max-steps", "10"], "did you mean max_steps=10?"),
        (["--lr=3e-3"], "did you mean lr=3e-3?"),
        (["--compile", "--batch-size", "8"], "did you mean compile=true batch_size=8?"),
    ]:
        line = _one_error_line(*_cli(capsys, *base, *flags)[::2])
        assert "unrecognized arguments" in line and hint in line, line
    line = _one_error_line(*_cli(capsys, *base, "--bogus")[::2])
    assert "unrecognized arguments: --bogus" in line and "did you mean" not in line
    assert not (tmp_path / "r").exists()


def test_resume_of_a_finished_run_exits_0_says_how_to_extend_it_and_that_command_works(
    capsys, datasets, tmp_path
):
    """A finished run resumed (a scheduler's requeue) is a no-op: status 0, one line, nothing written."""
    small, _ = datasets
    run = tmp_path / "run"
    assert _cli(capsys, "train", "--data", small, "--out", run, *TINY, "max_steps=2")[0] == 0
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*"))
    code, out, err = _cli(capsys, "train", "--out", run, "--resume")
    assert code == 0 and err == "", err
    (line,) = out.splitlines()
    assert "finished (step 2 of max_steps=2)" in line and "--resume max_steps=4" in line
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run.rglob("*")) == before  # nothing touched
    command = line.split("raise max_steps: ", 1)[1].split()
    assert command[:2] == ["gptlab", "train"]
    code, out, err = _cli(capsys, *command[1:])  # the command the line gives
    assert code == 0, err
    assert "changed: max_steps 2 → 4" in out  # --resume says what differs from the run's settings
    assert ckpt.latest_step(run) == 4
    steps = [r["step"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
    assert steps == [1, 2, 3, 4]


def test_a_failed_start_leaves_no_half_run(capsys, datasets, tmp_path, monkeypatch):
    small, _ = datasets
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # tensorboard not installed
    fresh, existing = tmp_path / "fresh", tmp_path / "existing"
    existing.mkdir()
    (existing / "notes.txt").write_text("mine")
    for out in (fresh, existing):
        code, _, err = _cli(capsys, "train", "--data", small, "--out", out, *TINY, 'loggers=["tensorboard"]')
        assert "pip install tensorboard" in _one_error_line(code, err)
    assert not fresh.exists()
    assert sorted(p.name for p in existing.iterdir()) == ["notes.txt"]  # what was there stays
    code, _, err = _cli(capsys, "train", "--data", small, "--out", existing, *TINY, "max_steps=2")
    assert code == 0, err  # a new run starts where the failed one was


def test_eval_shows_a_progress_bar(capsys, datasets, tmp_path):
    small, _ = datasets
    run = tmp_path / "run"
    assert _cli(capsys, "train", "--data", small, "--out", run, *TINY, "max_steps=2")[0] == 0
    code, out, err = _cli(capsys, "eval", run, "--data", small, "--batch-size", "2")
    assert code == 0 and "bits/byte" in out
    assert "eval: 100%" in err and "batch" in err
    code, out, err = _cli(capsys, "eval", run, "--data", small, "--no-progress")
    assert code == 0 and "eval:" not in err


def test_a_tokenizer_that_does_not_fit_the_model_is_refused(capsys, datasets, tmp_path):
    small, large = datasets
    run = tmp_path / "run"
    assert _cli(capsys, "train", "--data", small, "--out", run, *TINY, "max_steps=2")[0] == 0
    big = large / "tokenizer.json"
    # at sampling time, given on the command line
    code, _, err = _cli(capsys, "sample", run, "--tokenizer", big, "--max-new-tokens", "3")
    assert "tokenizer has" in _one_error_line(code, err) and "vocabulary is" in err
    # at load time, inside the checkpoint
    shutil.copy(big, ckpt.resolve_checkpoint(run) / ckpt.TOKENIZER_FILE)
    write_checksums(ckpt.resolve_checkpoint(run))  # recorded as it is now: the fit itself is checked
    for argv in (["sample", run, "--max-new-tokens", "3"], ["eval", run, "--data", small]):
        code, _, err = _cli(capsys, *argv)
        assert "tokenizer has" in _one_error_line(code, err), argv
    # at train start: a dataset whose tokenizer is larger than the vocabulary of its ids
    mixed = tmp_path / "mixed"
    shutil.copytree(small, mixed)
    shutil.copy(big, mixed / "tokenizer.json")
    code, _, err = _cli(capsys, "train", "--data", mixed, "--out", tmp_path / "r2", *TINY)
    assert "tokenizer has" in _one_error_line(code, err)
    assert not (tmp_path / "r2").exists()


def test_train_without_config_trains_the_best_recipe_and_an_unknown_recipe_is_one_line(
    capsys, datasets, tmp_path
):
    from gptlab.train.config import build_config

    small, _ = datasets
    run = tmp_path / "run"
    assert _cli(capsys, "train", "--data", small, "--out", run, *TINY, "max_steps=1")[0] == 0
    saved = ckpt.read_run_config(run)
    best = build_config("char-best", TINY + ["max_steps=1"]).to_dict()
    assert _unresolved(saved["train"], best) == _unresolved(best, best)
    assert saved["train"]["dtype"] != "auto" and saved["train"]["attention"] != "auto"
    assert (saved["model"]["pos"], saved["model"]["norm"], saved["model"]["mlp"]) == (
        "rope",
        "rmsnorm",
        "relu2",
    )
    # an unknown recipe name (the pre-release alias shakespeare-char is gone) is one line naming the recipes
    code, _, err = _cli(
        capsys, "train", "--data", small, "--out", tmp_path / "old", "--config", "shakespeare-char", *TINY
    )
    assert "no such config file or built-in recipe; recipes: " in _one_error_line(code, err)
    assert "char-best" in err and not (tmp_path / "old").exists()


def _unresolved(settings: dict, recipe: dict) -> dict:
    """The settings that the recipe does not leave to ``auto`` (a run records what ``auto`` resolved to)."""
    return {k: v for k, v in settings.items() if recipe.get(k) != "auto"}
