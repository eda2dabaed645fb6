"""Muon across ranks (``gptlab.train.muon_sharded``): whole-matrix Newton–Schulz on one owner rank per
matrix, under FSDP2 (rows gathered and scattered) and DDP (broadcast); the default recipe (Muon)
trains under ``strategy=fsdp`` and equals one process."""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from gptlab.hardware import native_bf16
from gptlab.train import train
from gptlab.train.config import DEFAULT_RECIPE, build_config
from gptlab.train.muon import Float32Muon, muon_class, ns_dtype
from tests.train._torchrun import final_weights, line_dataset, torchrun_train

# rows 7 and 5 split unevenly over 2 ranks; a 1-row matrix leaves rank 1 no rows at all
SHAPES = [(7, 6), (5, 9), (6, 6), (1, 4), (8, 3)]
STEPS = 3


def _grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(shape, generator=g) for shape in SHAPES]


def _params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(shape, generator=g)) for shape in SHAPES]


def _settings() -> dict:
    return {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.1, "adjust_lr_fn": "original"}


CASES = [(layout, ns) for layout in ("sharded", "replicated") for ns in (torch.bfloat16, torch.float32)]


def _worker(rank: int, world: int, init: str, out: str) -> None:
    """For each of ``CASES``: ``STEPS`` of ShardedMuon on ``SHAPES`` with the same full gradients on every rank."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from gptlab.train.muon_sharded import ShardedMuon

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        torch.set_num_threads(1)
        mesh = init_device_mesh("cpu", (world,))
        saved = {}
        for layout, ns in CASES:
            sharded = layout == "sharded"  # as fully_shard holds them: DTensors split on dim 0
            params = [
                torch.nn.Parameter(distribute_tensor(p.data, mesh, [Shard(0)]) if sharded else p.data)
                for p in _params()
            ]
            opt = ShardedMuon(params, ns_dtype=ns, **_settings())
            for step in range(STEPS):
                for p, g in zip(params, _grads(step), strict=True):
                    p.grad = distribute_tensor(g, mesh, [Shard(0)]) if sharded else g
                opt.step()
            for i, p in enumerate(params):
                buf = opt.state[p]["momentum_buffer"]
                saved[f"{layout}.{ns}.p{i}"] = (p.full_tensor() if sharded else p).detach().contiguous()
                saved[f"{layout}.{ns}.b{i}"] = (buf.full_tensor() if sharded else buf).contiguous()
        if rank == 0:
            save_file(saved, out)
    finally:
        dist.destroy_process_group()


def _one_process(ns: torch.dtype) -> dict[str, torch.Tensor]:
    params = _params()
    opt = (torch.optim.Muon if ns == torch.bfloat16 else Float32Muon)(params, **_settings())
    for step in range(STEPS):
        for p, g in zip(params, _grads(step), strict=True):
            p.grad = g
        opt.step()
    out = {f"p{i}": p.detach() for i, p in enumerate(params)}
    out.update({f"b{i}": opt.state[p]["momentum_buffer"] for i, p in enumerate(params)})
    return out


@pytest.mark.slow
def test_sharded_muon_on_2_ranks_is_torchs_muon_on_one(tmp_path):
    """Given the same gradients, 2 gloo ranks (FSDP-sharded rows, or DDP-replicated matrices) end where
    ``torch.optim.Muon`` ends on one process: bitwise with Newton–Schulz in bfloat16 (the same products
    on the same whole matrix), to float32 rounding against the batched float32 NS of ``Float32Muon``."""
    out = tmp_path / "two.safetensors"
    mp.spawn(_worker, args=(2, f"file://{tmp_path / 'store'}", str(out)), nprocs=2, join=True)
    got = load_file(str(out))
    for layout, ns in CASES:
        want = _one_process(ns)
        for k in want:
            if ns == torch.bfloat16:
                assert torch.equal(got[f"{layout}.{ns}.{k}"], want[k]), (layout, k)
            else:
                torch.testing.assert_close(got[f"{layout}.{ns}.{k}"], want[k], rtol=0, atol=1e-6, msg=k)
        assert not torch.equal(got[f"{layout}.{ns}.p0"], _params()[0].detach())  # it moved


def test_newton_schulz_follows_a_pinned_float32():
    """``dtype=float32`` keeps every product in float32, Muon's included; auto/bf16 keep bf16 where native."""
    assert ns_dtype("cpu", "float32") == torch.float32 and muon_class("cpu", "float32") is Float32Muon
    native = torch.bfloat16 if native_bf16("cpu") else torch.float32
    assert ns_dtype("cpu", "auto") == native == ns_dtype("cpu", "bfloat16")


def _default_recipe_settings() -> list[str]:
    """The default recipe (char-best: Muon + AdamW), shrunk, in float32 on the CPU."""
    return [
        "dtype=float32",
        "device=cpu",
        "threads=1",
        "progress=false",
        "model.n_layer=2",
        "model.n_embd=64",
        "model.block_size=16",
        "max_steps=20",
        "warmup_steps=5",
        "warmdown_steps=10",
        "eval_every=1000",
        "eval_batches=2",
        "ckpt_every=1000",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_the_default_recipe_trains_on_2_ranks_and_equals_one_process(tmp_path, strategy):
    """``torchrun --nproc_per_node=2 -m gptlab train ... strategy=fsdp`` with no --config (Muon) trains,
    and after 20 steps its weights are one process's (B=4 against 2 ranks of B=2) to 1e-5."""
    ds = line_dataset(tmp_path)
    steps = _default_recipe_settings()
    proc = torchrun_train(
        2, ["--data", str(ds), "--out", str(tmp_path / "two"), *steps, "batch_size=2", f"strategy={strategy}"]
    )
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    assert "Newton–Schulz in float32" in err
    cfg = build_config(DEFAULT_RECIPE, [*steps, "batch_size=4"])
    assert cfg.optimizer == "muon"
    train(cfg, ds, tmp_path / "one")
    two, one = final_weights(tmp_path / "two", tmp_path, "a"), final_weights(tmp_path / "one", tmp_path, "b")
    assert sorted(two) == sorted(one)
    for k in one:
        torch.testing.assert_close(two[k], one[k], rtol=0, atol=1e-5, msg=k)
    if strategy == "fsdp":  # a requeue of the finished run: status 0, said once (not once per rank)
        proc = torchrun_train(2, ["--out", str(tmp_path / "two"), "--resume"])
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
        (line,) = out.splitlines()
        assert "this run is finished (step 20 of max_steps=20)" in line and "--resume max_steps=40" in line


@pytest.mark.slow
def test_a_refusal_under_torchrun_is_printed_once(tmp_path):
    ds = line_dataset(tmp_path)
    proc = torchrun_train(
        2, ["--data", str(ds), "--out", str(tmp_path / "r"), "strategy=fsdp", "compile=true", "device=cpu"]
    )
    _, err = proc.communicate(timeout=300)
    assert proc.returncode != 0
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert errors == ["error: strategy=fsdp runs uncompiled here; set compile=false"], err[-3000:]
