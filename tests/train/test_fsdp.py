"""FSDP2 under torchrun (2 gloo ranks on CPU): equal to one process, sharded checkpoints, SIGKILL + resume."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
import torch

from gptlab import checkpoint as ckpt
from gptlab.checkpoint import sharded
from gptlab.errors import GptlabError
from gptlab.train import train
from gptlab.train.config import TrainConfig, build_config
from tests._kill import kill_tree
from tests._tiny import TINY_TRAIN
from tests.train._torchrun import final_weights, finish, line_dataset, torchrun_train

# no biases: a key bias gets a zero gradient in exact arithmetic (softmax ignores a constant added to
# every score), so AdamW's g/√v turns its rounding noise into ±lr steps that no two reduction orders share
SMALL = [*TINY_TRAIN, "model.n_layer=2", "model.bias=false", "eval_every=1000", "ckpt_every=1000"]


def _recipe(tmp_path: Path) -> Path:
    """The same plain float32 AdamW settings for torchrun (whose CLI default is the char-best recipe) and
    for ``build_config``."""
    recipe = tmp_path / "tiny.toml"
    recipe.write_text('dtype = "float32"\ndevice = "cpu"\n[model]\npreset = "char-tiny"\n')
    return recipe


@pytest.mark.slow
def test_fsdp_equals_one_process_and_sigkill_resume_is_bitwise(tmp_path):
    """2 FSDP ranks (B=1, 2 accumulated micro-batches, activation checkpointing) = one process (B=4, none)
    to 1e-5 after 120 steps; the same run SIGKILLed after a checkpoint and resumed is bitwise the
    uninterrupted one, and resumed on one process (DCP reshards 2 ranks' shards into one) it stays
    within 1e-5."""
    ds, recipe = line_dataset(tmp_path), _recipe(tmp_path)
    steps = ["--config", str(recipe), *SMALL, "model.n_embd=64", "max_steps=120", "ckpt_every=20"]
    steps += [
        "keep_last=20",
        "batch_size=1",
        "grad_accum=2",
        "strategy=fsdp",
        "activation_checkpointing=blocks",
    ]
    steps += ["reshard_after_forward=false"]  # the resume below reshards after each forward: same numbers
    finish(torchrun_train(2, ["--data", str(ds), "--out", str(tmp_path / "full"), *steps]))
    latest_full = ckpt.resolve_checkpoint(tmp_path / "full")
    assert sharded.is_sharded(latest_full)
    assert len(list((latest_full / sharded.SHARDED_DIR).glob("*.safetensors"))) == 2  # one file per rank
    one_process = [
        *steps[2:],
        "batch_size=4",
        "grad_accum=1",
        "strategy=ddp",
        "activation_checkpointing=none",
    ]
    train(build_config(str(recipe), one_process), ds, tmp_path / "single")
    full, single = (
        final_weights(tmp_path / "full", tmp_path, "a"),
        final_weights(tmp_path / "single", tmp_path, "-"),
    )
    assert sorted(full) == sorted(single) and "lm_head.weight" not in full  # the tied head is stored once
    for k in full:
        torch.testing.assert_close(full[k], single[k], rtol=0, atol=1e-5, msg=k)

    killed = tmp_path / "killed"
    proc = torchrun_train(2, ["--data", str(ds), "--out", str(killed), *steps])
    deadline = time.monotonic() + 300
    while not (killed / "ckpt-40").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    kill_tree(proc.pid)
    proc.communicate()
    latest = ckpt.list_checkpoints(killed)[-1][0]
    assert 40 <= latest < 120, "the run must be killed mid-way"
    one = tmp_path / "one"
    shutil.copytree(killed, one)
    train(build_config(str(recipe), [*steps[2:], "batch_size=2"]), ds, one, resume=True)
    finish(torchrun_train(2, ["--out", str(killed), "--resume", "reshard_after_forward=true"]))
    resumed = final_weights(killed, tmp_path, "b")
    for k in full:
        assert torch.equal(full[k], resumed[k]), k
    other = ckpt.read_tensors(ckpt.resolve_checkpoint(one) / ckpt.WEIGHTS_FILE)
    for k in full:
        torch.testing.assert_close(other[k], full[k], rtol=0, atol=1e-5)


def test_activation_checkpointing_equals_none_in_one_process(tmp_path):
    ds = line_dataset(tmp_path)
    runs = {}
    for mode in ("none", "blocks"):
        cfg = build_config(None, [*SMALL, "max_steps=20", f"activation_checkpointing={mode}"])
        train(cfg, ds, tmp_path / mode)
        runs[mode] = final_weights(tmp_path / mode, tmp_path, mode)
    assert not any("_checkpoint_wrapped" in k for k in runs["blocks"])  # saved names unchanged
    for k in runs["none"]:
        torch.testing.assert_close(runs["blocks"][k], runs["none"][k], rtol=0, atol=1e-6)


def _one_process_run(tmp_path: Path, extra: list[str]) -> Path:
    ds = line_dataset(tmp_path)
    cfg = build_config(None, [*SMALL, "max_steps=4", *extra])
    from gptlab.model import GPT
    from gptlab.train.distributed import DistInfo
    from gptlab.train.optim import build_optimizer

    torch.manual_seed(0)
    model = GPT(cfg.model_config(ckpt_vocab(ds)))
    opt = build_optimizer(model, TrainConfig(), "cpu")
    x = torch.randint(0, model.config.vocab_size, (2, 16))
    model(x, x)[1].backward()
    opt.step()
    sharded.save_training_checkpoint(tmp_path / "run", 1, model, opt, None, DistInfo(), {"x": 1})
    return tmp_path / "run"


def ckpt_vocab(ds: Path) -> int:
    from gptlab.data import TokenDataset

    return TokenDataset(ds).vocab_size


def test_a_crash_mid_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    run = _one_process_run(tmp_path, [])
    from gptlab.model import GPT
    from gptlab.train.distributed import DistInfo
    from gptlab.train.optim import build_optimizer

    model = GPT(ckpt.read_config(run / "ckpt-1" / ckpt.CONFIG_FILE))
    opt = build_optimizer(model, TrainConfig(), "cpu")
    sharded.load_training_state(run / "ckpt-1", model, opt, DistInfo(), seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    import torch.distributed.checkpoint as dcp

    real = dcp.HuggingFaceStorageWriter.write_data

    def crash(self, plan, planner):  # write the shard, then die before the checkpoint is complete
        real(self, plan, planner).wait()
        raise OSError("simulated crash mid-save")

    monkeypatch.setattr(dcp.HuggingFaceStorageWriter, "write_data", crash)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    with pytest.raises(
        GptlabError, match="cannot write checkpoint ckpt-2 .*simulated crash.*ckpt-1, is intact"
    ):
        sharded.save_training_checkpoint(run, 2, model, opt, None, DistInfo(), {})
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [1]  # the half-written one is not a checkpoint
    assert sorted(p.name for p in run.iterdir()) == ["ckpt-1"]
    fresh = GPT(model.config)
    fresh_opt = build_optimizer(fresh, TrainConfig(), "cpu")
    sharded.load_training_state(run / "ckpt-1", fresh, fresh_opt, DistInfo(), seed=0)
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, before[k])


def test_consolidate_and_one_line_errors(tmp_path, capsys):
    from gptlab.cli import main

    run = _one_process_run(tmp_path, [])
    with pytest.raises(GptlabError, match="convert --consolidate"):
        ckpt.load(run)
    assert main(["convert", "--consolidate", str(run), "--out", str(tmp_path / "c")]) == 0
    model, _ = ckpt.load(tmp_path / "c")
    assert model.lm_head.weight is model.wte.weight
    assert sorted(ckpt.read_tensors(tmp_path / "c" / ckpt.WEIGHTS_FILE)) == sorted(ckpt.model_state(model))
    capsys.readouterr()
    assert main(["convert", "--consolidate", str(tmp_path / "c"), "--out", str(tmp_path / "d")]) == 2
    assert "not a sharded checkpoint" in capsys.readouterr().err
    shard = next((run / "ckpt-1" / sharded.SHARDED_DIR).glob("*.safetensors"))
    shard.write_bytes(shard.read_bytes()[:-100])
    with pytest.raises(GptlabError, match=f"{shard.name}: SHA-256 differs") as exc:  # named by its checksum
        sharded.consolidate(run, tmp_path / "d")
    assert "\n" not in str(exc.value)
    # unverified (a checkpoint from before checksums): DCP's own check names it
    (run / "ckpt-1" / "checksums.json").unlink()
    with pytest.raises(GptlabError, match="truncated") as exc:
        sharded.consolidate(run, tmp_path / "d")
    assert "\n" not in str(exc.value)


def test_consolidate_keeps_the_context_of_a_run_fine_tuned_on_shorter_windows(tmp_path):
    from gptlab.model import GPT, GPTConfig
    from gptlab.train.distributed import DistInfo
    from gptlab.train.optim import build_optimizer

    config = GPTConfig(vocab_size=40, block_size=16, n_layer=1, n_head=2, n_embd=16, pos="rope", bias=False)
    model = GPT(config)
    model.pretrained_context = 32  # as gptlab.train.init.start sets it for model.block_size=16 on a 32 base
    opt = build_optimizer(model, TrainConfig(), "cpu")
    sharded.save_training_checkpoint(tmp_path / "run", 1, model, opt, None, DistInfo(), {})
    assert ckpt.read_config(tmp_path / "run" / "ckpt-1" / ckpt.CONFIG_FILE).block_size == 16  # as trained
    out = sharded.consolidate(tmp_path / "run", tmp_path / "c")
    assert ckpt.load(out)[0].config.block_size == 32
    assert ckpt.read_config(out / ckpt.CONFIG_FILE).block_size == 16


def test_size_shows_fsdp_per_rank_memory_at_most_055_of_ddp(capsys):
    from gptlab.cli import main
    from gptlab.model import GPTConfig
    from gptlab.train.strategy import per_rank_memory

    config = GPTConfig.preset("gpt2")
    ddp = per_rank_memory(config, "ddp", 2, 4)[0].value
    fsdp, gathered = (f.value for f in per_rank_memory(config, "fsdp", 2, 4))
    assert ddp == 4 * 4 * sum(_param_sizes(config))
    assert fsdp / ddp <= 0.501 and (fsdp + gathered) / ddp <= 0.55
    assert per_rank_memory(config, "fsdp", 8, 4)[0].value / ddp <= 0.126
    assert main(["size", "--preset", "gpt2", "--strategy", "fsdp", "--world-size", "2", "--json"]) == 0
    names = [f["name"] for f in json.loads(capsys.readouterr().out)["training_memory"]]
    assert "fsdp per rank (W=2)" in names


def _param_sizes(config) -> list[int]:
    from gptlab.inspect.size import meta_model

    return [p.numel() for p in {id(p): p for p in meta_model(config).parameters()}.values()]


def test_local_bytes_counts_weights_gradients_and_moments():
    from gptlab.model import GPT, GPTConfig
    from gptlab.train.optim import build_optimizer
    from gptlab.train.strategy import local_bytes

    model = GPT(GPTConfig.preset("char-tiny", vocab_size=32, n_layer=1, n_embd=32, n_head=2))
    opt = build_optimizer(model, TrainConfig(), "cpu")
    x = torch.randint(0, 32, (2, 8))
    model(x, x)[1].backward()
    opt.step()
    n = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    assert local_bytes(model, opt) == {"params": 4 * n, "grads": 4 * n, "optimizer": 8 * n}


def test_fsdp_mixed_precision_follows_dtype(tmp_path):
    """dtype=bfloat16: blocks run with bf16 weights, the sharded master weights and gradients stay fp32,
    and the tied head stays the embedding (one process group of one gloo rank, in this process)."""
    import torch.distributed as dist

    from gptlab.model import GPT, GPTConfig
    from gptlab.train.distributed import DistInfo
    from gptlab.train.strategy import STRATEGIES, mixed_precision_policy

    assert mixed_precision_policy("float32").param_dtype is None
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        cfg = build_config(None, ["strategy=fsdp", "dtype=bfloat16"])
        model = GPT(GPTConfig.preset("char-tiny", vocab_size=32, n_layer=2, n_embd=32, n_head=2))
        forward = STRATEGIES["fsdp"].wrap(model, cfg, DistInfo(rank=0, world_size=1, device="cpu"))
        seen = []
        model.blocks[0].mlp.register_forward_hook(lambda m, i, o: seen.append(o.dtype))
        x = torch.randint(0, 32, (2, 8))
        forward(x, x)[1].backward()
        assert seen == [torch.bfloat16]
        assert model.lm_head.weight is model.wte.weight
        for p in model.parameters():
            assert (
                type(p).__name__ == "DTensor" and p.dtype == torch.float32 and p.grad.dtype == torch.float32
            )
        with pytest.raises(
            GptlabError, match="compile=false"
        ):  # Muon is no refusal (gptlab.train.muon_sharded)
            STRATEGIES["fsdp"].wrap(model, build_config(None, ["optimizer=muon", "compile=true"]), DistInfo())
    finally:
        dist.destroy_process_group()
