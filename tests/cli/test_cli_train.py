"""The prepare / train / eval / download / demo commands: bad input, SIGKILL, Ctrl-C, eval on a run dir."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import torch

from gptlab import checkpoint as ckpt
from gptlab.cli import main
from gptlab.data import TokenDataset
from gptlab.evaluate.loss import evaluate_tokens
from gptlab.train import train
from gptlab.train.config import DEFAULT_RECIPE, build_config
from tests._kill import kill_and_resume, steps_logged
from tests._tiny import TINY_TRAIN

TINY = [*TINY_TRAIN, "batch_size=4"]


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def _bad_cases(tmp, dataset, trained):
    (tmp / "empty.txt").write_text("")
    (tmp / "bin.txt").write_bytes(b"abc\x00def" * 20)
    (tmp / "latin1.txt").write_bytes("caf\xe9 au lait ".encode("latin-1") * 20)
    (tmp / "tiny.txt").write_text("hi")
    (tmp / "other.txt").write_text("another text entirely\n" * 50)
    (tmp / "x.jsonl").write_text('{"body": "no text field"}\n')
    return [
        (["prepare", tmp / "missing.txt", "--out", tmp / "o1"], "no such file"),
        (["prepare", tmp / "empty.txt", "--out", tmp / "o2"], "empty"),
        (["prepare", tmp / "bin.txt", "--out", tmp / "o3"], "binary"),
        (["prepare", tmp / "latin1.txt", "--out", tmp / "o4"], "offset 3"),
        (["prepare", tmp / "tiny.txt", "--out", tmp / "o5"], "too small"),
        (["prepare", tmp / "x.jsonl", "--out", tmp / "o6"], "text"),
        (["prepare", tmp / "other.txt", "--out", dataset], "different dataset"),
        (["prepare", tmp / "other.txt", "--out", tmp / "o7", "--tokenizer", "bpe:lots"], "integer"),
        (["prepare", tmp / "other.txt", "--out", tmp / "o8", "--val-fraction", "1.5"], "val-fraction"),
        (["train", "--data", dataset, "--out", tmp / "r1", "bogus=1"], "valid keys"),
        (["train", "--data", dataset, "--out", tmp / "r2", "model.layers=2"], "valid model keys"),
        (["train", "--data", dataset, "--out", tmp / "r3", "lr"], "key=value"),
        (["train", "--data", tmp / "nodata", "--out", tmp / "r4"], "not a dataset"),
        (["train", "--data", dataset, "--out", trained], "--resume"),
        (["train", "--out", tmp / "r5", "--resume"], "no such run"),
        (["train", "--data", dataset, "--out", tmp / "r6", "--config", "no-such-recipe"], "recipe"),
        (["train", "--data", dataset, "--out", tmp / "r7", "dtype=float16", "device=cpu"], "CUDA"),
        (
            ["train", "--data", dataset, "--out", tmp / "r8", "model.block_size=100000"],
            "fewer than one block",
        ),
        (["eval", tmp / "nockpt", "--data", dataset], "no such checkpoint"),
        (["eval", trained, "--text", tmp / "missing.txt"], "does not exist"),
        (["eval", trained, "--data", tmp / "nodata"], "not a dataset"),
    ]


def test_bad_input_is_one_error_line_with_status_2(capsys, tmp_path, dataset, trained):
    for argv, match in _bad_cases(tmp_path, dataset, trained):
        code, _, err = _cli(capsys, *argv)
        assert code == 2, (argv, err)
        assert err.startswith("error: ") and match in err and "Traceback" not in err, (argv, err)
    # failed prepares left nothing half-written behind
    assert not [p for p in tmp_path.iterdir() if p.is_dir()]


def test_a_validation_split_shorter_than_a_window_is_refused_before_the_first_step(capsys, tmp_path, dataset):
    """A context the training split holds but the validation split does not: one error line before
    any step, not after the steps up to the first evaluation (a minute of a fine-tune was lost so)."""
    meta = json.loads((dataset / "meta.json").read_text())
    T = meta["val_tokens"]  # one window of T + 1 tokens: in the training split, not in the validation one
    assert meta["train_tokens"] > 2 * (T + 1)
    argv = ["train", "--data", dataset, "--out", tmp_path / "r", *TINY, f"model.block_size={T}"]
    code, _, err = _cli(capsys, *argv, "max_steps=3", "eval_every=3")
    assert code == 2 and err.startswith("error: the validation split has") and err.count("\n") == 1, err
    assert not (tmp_path / "r").exists()  # refused as it started: no step ran, no run directory left


def test_download_offline_is_a_clear_error(capsys, tmp_path, monkeypatch):
    def offline(*args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    code, _, err = _cli(capsys, "download", "shakespeare", "--out", tmp_path)
    assert code == 2 and "offline" in err and not list(tmp_path.iterdir())


def test_eval_on_a_run_dir(capsys, dataset, trained, tmp_path):
    code, out, _ = _cli(capsys, "eval", trained, "--data", dataset, "--json")
    assert code == 0
    result = json.loads(out)
    assert result["ppl"] == pytest.approx(torch.tensor(result["loss"]).exp().item(), rel=1e-5)
    assert 0 < result["bpb"] < 8 and "ckpt-4" in result["source"]
    (tmp_path / "t.txt").write_text("to be or not to be, line 7; that is the question 3.\n" * 10)
    code, out, _ = _cli(capsys, "eval", trained, "--text", tmp_path / "t.txt")
    assert code == 0 and "bits/byte" in out


def test_eval_context_sets_the_window_length_and_refuses_what_the_model_cannot_see(capsys, dataset, trained):
    code, out, _ = _cli(capsys, "eval", trained, "--data", dataset, "--json")
    full = json.loads(out)
    # float32, like the reference below (auto autocasts to bf16 on a native-bf16 CPU)
    code, out, _ = _cli(
        capsys, "eval", trained, "--data", dataset, "--json", "--context", 4, "--dtype", "float32"
    )
    short = json.loads(out)
    assert code == 0 and short["loss"] != full["loss"]
    model, _ = ckpt.load(trained)
    ds = TokenDataset(dataset)
    ref = evaluate_tokens(model, ds.split("val"), 16, ds.bytes_per_token("val"), context=4)
    assert short["loss"] == pytest.approx(ref.loss, rel=1e-6)  # windows of 4 tokens, not the model's
    for bad in (0, model.config.block_size + 1):
        code, out, err = _cli(capsys, "eval", trained, "--data", dataset, "--context", bad)
        assert code == 2 and not out and err.startswith("error: --context must be between 1 and")
        assert len(err.strip().splitlines()) == 1


def _launch(dataset, run, *extra, resume=False):
    argv = [sys.executable, "-m", "gptlab", "train", "--out", str(run), *TINY, *extra]
    argv += ["--resume"] if resume else ["--data", str(dataset)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


@pytest.mark.slow
def test_sigkill_at_random_moments_always_resumes(dataset, tmp_path):
    # bitwise CPU float32 numerics (a GPU, or bf16 on a CPU that has it, is not bitwise across processes)
    settings = ["max_steps=20", "ckpt_every=2", "eval_every=10", "keep_last=2", "device=cpu", "dtype=float32"]
    # `gptlab train` without --config trains the default recipe
    reference = train(build_config(DEFAULT_RECIPE, [*TINY, *settings]), dataset, tmp_path / "ref")
    run = tmp_path / "run"
    kill_and_resume(lambda resume: _launch(dataset, run, *settings, resume=resume), run, kills=3)
    final = ckpt.resolve_checkpoint(run)
    assert final.name == "ckpt-20"
    a = ckpt.read_tensors(final / ckpt.WEIGHTS_FILE)
    b = ckpt.read_tensors(reference.checkpoint / ckpt.WEIGHTS_FILE)
    assert all(torch.equal(a[k], b[k]) for k in a)  # killed and resumed = never interrupted, bitwise


def test_ctrl_c_saves_and_exits_cleanly(dataset, tmp_path):
    run = tmp_path / "run"
    proc = _launch(dataset, run, "max_steps=100000", "ckpt_every=100000")
    deadline = time.time() + 120
    while steps_logged(run) < 3 and time.time() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err and "--resume" in err
    step, path = ckpt.list_checkpoints(run)[-1]
    assert step >= 3 and ckpt.read_training_checkpoint(path)[1]["step"] == step


def test_demo_runs_offline(capsys, tmp_path):
    code, out, err = _cli(
        capsys,
        "demo",
        "--out",
        tmp_path / "demo",
        "--max-steps",
        "3",
        "compile=false",
        "dtype=float32",
        "model.n_layer=1",
        "model.n_embd=32",
        "model.block_size=32",
        "eval_batches=1",
        "threads=1",
        "progress=false",
    )
    assert code == 0
    assert "---- sample ----" in out and str(tmp_path / "demo" / "loss.png") in out
    # 400 characters past a 32-token context: said once in the output, not as a warning
    assert "each one is predicted from the last 32" in out
    assert "passed the context" not in err
    assert (tmp_path / "demo" / "loss.png").is_file() and ckpt.list_checkpoints(tmp_path / "demo")[-1][0] == 3
