"""Muon's step on 2 gloo ranks: ``ShardedMuon`` (each matrix orthogonalised by one owner; FSDP rows or
DDP whole matrices) against every rank running ``torch.optim.Muon``/``Float32Muon`` on all matrices, for
the hidden matrices of the char-best recipe (4 blocks, d_model 96, d_ff 288). Prints one JSON line
(median milliseconds per step, rank 0).

    PYTHONPATH=src python bench/muon_sharded.py [--steps 40] [--layers 4] [--d 96] [--ff 288]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.multiprocessing as mp


def _shapes(layers: int, d: int, ff: int) -> list[tuple[int, int]]:
    return [(3 * d, d), (d, d), (ff, d), (d, ff)] * layers


def _time(opt: torch.optim.Optimizer, params: list, grads: list, steps: int, set_grad) -> float:
    import torch.distributed as dist

    times = []
    for _ in range(steps):
        for p, g in zip(params, grads, strict=True):
            p.grad = set_grad(g)
        dist.barrier()
        t0 = time.perf_counter()
        opt.step()
        dist.barrier()
        times.append(time.perf_counter() - t0)
    return statistics.median(times[steps // 4 :]) * 1000


def _worker(rank: int, world: int, init: str, args: argparse.Namespace, out: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    from gptlab.train.muon import muon_class, ns_dtype
    from gptlab.train.muon_sharded import ShardedMuon

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    torch.set_num_threads(1)
    mesh = init_device_mesh("cpu", (world,))
    gen = torch.Generator().manual_seed(0)
    shapes = _shapes(args.layers, args.d, args.ff)
    grads = [torch.randn(s, generator=gen) for s in shapes]
    settings = {"lr": 0.02, "momentum": 0.95, "adjust_lr_fn": "original"}
    ns = ns_dtype("cpu")
    result = {}
    whole = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    result["every_rank_all_matrices_ms"] = _time(
        muon_class("cpu")(whole, **settings), whole, grads, args.steps, lambda g: g
    )
    whole = [torch.nn.Parameter(torch.randn(s, generator=gen)) for s in shapes]
    result["sharded_muon_ddp_ms"] = _time(
        ShardedMuon(whole, ns_dtype=ns, **settings), whole, grads, args.steps, lambda g: g
    )
    rows = [
        torch.nn.Parameter(distribute_tensor(torch.randn(s, generator=gen), mesh, [Shard(0)])) for s in shapes
    ]
    result["sharded_muon_fsdp_ms"] = _time(
        ShardedMuon(rows, ns_dtype=ns, **settings),
        rows,
        grads,
        args.steps,
        lambda g: distribute_tensor(g, mesh, [Shard(0)]),
    )
    if rank == 0:
        Path(out).write_text(json.dumps({k: round(v, 2) for k, v in result.items()}))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d", type=int, default=96)
    ap.add_argument("--ff", type=int, default=288)
    args = ap.parse_args()
    from gptlab.train.muon import ns_dtype

    with tempfile.TemporaryDirectory() as tmp:
        out = str(Path(tmp) / "out.json")
        mp.spawn(_worker, args=(2, f"file://{tmp}/store", args, out), nprocs=2, join=True)
        result = json.loads(Path(out).read_text())
    shapes = _shapes(args.layers, args.d, args.ff)
    print(
        json.dumps(
            {
                "bench": "muon_sharded",
                "ranks": 2,
                "matrices": len(shapes),
                "newton_schulz": str(ns_dtype("cpu")).removeprefix("torch."),
                **result,
            }
        )
    )


if __name__ == "__main__":
    main()
