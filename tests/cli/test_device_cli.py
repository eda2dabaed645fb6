"""--device / device= on every command that runs the model, dtype=auto in a run's records and on resume."""

from __future__ import annotations

import json

import pytest

from gptlab import hardware
from gptlab.cli import main
from gptlab.errors import GptlabError
from gptlab.train import distributed, resolve_run, train
from gptlab.train.config import build_config
from gptlab.train.loop import RUN_CONFIG_FILE
from tests._machines import AVX2, AVX512_BF16, CUDA_BF16
from tests._tiny import TINY_TRAIN

TINY = [*TINY_TRAIN, "batch_size=4", "eval_every=2"]


def _bad_device_commands(tmp, dataset, trained, device):
    out = tmp / "written"
    return [
        ["train", "--data", dataset, "--out", out, *TINY, "max_steps=1", f"device={device}"],
        ["eval", trained, "--data", dataset, "--device", device],
        ["sample", trained, "--prompt", "to be", "--max-new-tokens", "2", "--device", device],
        ["trace", trained, "to be", "--device", device],
        ["attention", trained, "to be", "-o", out / "a.png", "--device", device],
        ["serve", trained, "--port", "0", "--device", device],
    ]


@pytest.mark.parametrize(
    ("machine", "device", "message"),
    [
        (AVX2, "cuda", "device 'cuda' is not available here (this torch has no CUDA); use "),
        (AVX2, "gpu", "unknown device 'gpu'; choose one of auto, cpu, cuda, cuda:N or mps"),
        (CUDA_BF16, "cuda:7", "device 'cuda:7' is not available here (this machine has 1 GPU, cuda:0)"),
        (AVX2, "mps", "device 'mps' is not available here"),
    ],
)
def test_a_bad_device_is_one_line_exit_2_and_nothing_written(
    machine, device, message, dataset, trained, tmp_path, capsys, monkeypatch
):
    monkeypatch.setattr(hardware, "detect", lambda: machine)
    before = sorted(p.name for p in trained.iterdir())
    for argv in _bad_device_commands(tmp_path, dataset, trained, device):
        code = main([str(a) for a in argv])
        out, err = capsys.readouterr()
        assert code == 2, argv
        assert err.startswith("error: ") and err.count("\n") == 1 and message in err, (argv, err)
        assert "Traceback" not in err and out == ""
        spelled = "device=" if argv[0] == "train" else "--device "  # the fix as this command spells it
        assert f"use {spelled}" in err or device == "gpu"
    assert not (tmp_path / "written").exists()
    assert sorted(p.name for p in trained.iterdir()) == before


def test_more_processes_than_gpus_fails_before_joining_the_group(monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: CUDA_BF16)
    for key, value in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(GptlabError, match="^2 processes but 1 GPU; use --nproc_per_node=1 or device=cpu$"):
        distributed.setup("auto")


def test_auto_is_printed_recorded_and_kept_on_resume(dataset, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: AVX2)
    monkeypatch.setattr(hardware, "PLAIN_CONTEXT", 8)  # the 16-token model attends through sdpa here
    run = tmp_path / "run"
    cfg = build_config(None, [*TINY, "max_steps=2", "ckpt_every=2", "optimizer=muon", "compile=auto"])
    train(cfg, dataset, run)
    err = capsys.readouterr().err
    assert (
        "hardware: cpu (AVX2, no native bf16): dtype float32, attention sdpa, Muon Newton–Schulz in float32, "
        "eager" in err
    )
    record = json.loads((run / RUN_CONFIG_FILE).read_text())["resolved"]
    assert (
        record["device"],
        record["dtype"],
        record["attention"],
        record["newton_schulz"],
        record["compile"],
    ) == ("cpu", "float32", "sdpa", "float32", False)
    assert record["requested"] == {
        "device": "auto",
        "dtype": "auto",
        "attention": "auto",
        "compile": "auto",
        "loss_impl": "auto",
    }
    assert record["loss_impl"] == "plain"  # a tiny vocabulary: its logits are small

    # the same run resumed where auto would choose bf16 (and with the recipe's "auto" given again)
    monkeypatch.setattr(hardware, "detect", lambda: AVX512_BF16)
    fresh = build_config(None, [*TINY, "max_steps=2"])
    fresh_plan = hardware.plan(dtype=fresh.dtype)
    assert (fresh_plan.dtype, fresh_plan.attention, fresh_plan.compile) == ("bfloat16", "plain", True)
    again_auto = ["max_steps=4", "dtype=auto", "attention=auto", "compile=auto"]
    cfg, data = resolve_run(run, None, True, None, again_auto)
    assert (cfg.dtype, cfg.attention, cfg.compile) == ("float32", "sdpa", False)
    train(cfg, data, run, resume=True)
    again = json.loads((run / RUN_CONFIG_FILE).read_text())["resolved"]
    assert (again["dtype"], again["attention"], again["compile"]) == ("float32", "sdpa", False)
    # an explicit override still wins
    cfg, _ = resolve_run(run, None, True, None, ["max_steps=6", "dtype=bfloat16"])
    assert cfg.dtype == "bfloat16"


def test_a_short_context_trains_through_the_plain_path_on_a_cpu(dataset, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: AVX2)
    train(build_config(None, [*TINY, "max_steps=1"]), dataset, tmp_path / "run")  # a 16-token context
    assert "dtype float32, attention plain," in capsys.readouterr().err
    record = json.loads((tmp_path / "run" / RUN_CONFIG_FILE).read_text())["resolved"]
    assert (record["attention"], record["requested"]["attention"]) == ("plain", "auto")


def test_explicit_bf16_on_an_emulating_cpu_warns_once(dataset, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: AVX2)
    monkeypatch.setattr(hardware, "bf16_slowdown", lambda: 14.0)
    train(build_config(None, [*TINY, "max_steps=1", "dtype=bfloat16"]), dataset, tmp_path / "run")
    err = capsys.readouterr().err
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(warnings) == 1 and "dtype=bfloat16" in warnings[0] and "about 14× slower" in warnings[0]
    record = json.loads((tmp_path / "run" / RUN_CONFIG_FILE).read_text())["resolved"]
    assert (record["dtype"], record["attention"]) == ("bfloat16", "plain")  # honoured


def test_inference_commands_run_on_the_device_auto_picks(dataset, trained, capsys, monkeypatch):
    monkeypatch.setattr(hardware, "detect", lambda: AVX2)
    code = main(["sample", str(trained), "--prompt", "to be", "--max-new-tokens", "3", "--seed", "0"])
    err = capsys.readouterr().err
    assert code == 0 and "(bf16 weights)" in err  # auto, one sequence, no native bf16: bf16 matrices
    sample = ["sample", str(trained), "--prompt", "to be", "--max-new-tokens", "3", "--num-samples", "2"]
    code = main(sample)
    err = capsys.readouterr().err
    assert code == 0 and "(fp32 weights)" in err  # several sequences there: fp32
    monkeypatch.setattr(hardware, "bf16_slowdown", lambda: 14.0)
    code = main(["sample", str(trained), "--prompt", "to be", "--max-new-tokens", "3", "--dtype", "bf16"])
    err = capsys.readouterr().err
    assert code == 0 and "(bf16 weights)" in err
    assert not any(line.startswith("warning:") for line in err.splitlines())  # they compute in float32
    code = main(["eval", str(trained), "--data", str(dataset), "--max-batches", "1", "--json"])
    assert code == 0 and json.loads(capsys.readouterr().out)["tokens"] > 0
    code = main(["eval", str(trained), "--data", str(dataset), "--max-batches", "1", "--dtype", "bfloat16"])
    err = capsys.readouterr().err  # eval's --dtype is an autocast dtype: emulated here, and said once
    assert code == 0 and sum(line.startswith("warning: --dtype bfloat16") for line in err.splitlines()) == 1
