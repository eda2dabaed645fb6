"""Per-rank weights + gradients + AdamW state under DDP and FSDP with 2 gloo ranks (measured), beside
``gptlab size --strategy … --world-size 2`` (predicted). Prints one JSON line.

    PYTHONPATH=src python bench/fsdp_memory.py [--preset gpt2] [--world-size 2]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import types

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, world: int, port: int, preset: str, strategy: str, out: dict) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from gptlab.model import GPT, GPTConfig
    from gptlab.train.config import TrainConfig
    from gptlab.train.distributed import DistInfo
    from gptlab.train.optim import build_optimizer
    from gptlab.train.strategy import local_bytes, prepare_model

    torch.manual_seed(0)
    config = GPTConfig.preset(preset, block_size=32)
    model = GPT(config)
    cfg = types.SimpleNamespace(
        strategy=strategy,
        activation_checkpointing="none",
        optimizer="adamw",
        compile=False,
        dtype="float32",
        reshard_after_forward=True,
    )
    info = DistInfo(rank=rank, world_size=world, device="cpu")
    _, forward = prepare_model(model, cfg, info)
    opt = build_optimizer(model, TrainConfig(lr=1e-4), "cpu")
    x = torch.randint(0, config.vocab_size, (1, 32))
    forward(x, x)[1].backward()
    opt.step()
    sizes = local_bytes(model, opt)
    if rank == 0:
        out[strategy] = sizes
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="gpt2")
    ap.add_argument("--world-size", type=int, default=2)
    args = ap.parse_args()
    from gptlab.inspect.size import count_parameters  # noqa: F401 (import check)
    from gptlab.model import GPTConfig
    from gptlab.train.strategy import per_rank_memory

    manager = mp.Manager()
    out = manager.dict()
    for strategy in ("ddp", "fsdp"):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        mp.spawn(_rank, args=(args.world_size, port, args.preset, strategy, out), nprocs=args.world_size)
    measured = {k: sum(v.values()) for k, v in out.items()}
    config = GPTConfig.preset(args.preset, block_size=32)
    predicted = {s: per_rank_memory(config, s, args.world_size, 4)[0].value for s in ("ddp", "fsdp")}
    print(
        json.dumps(
            {
                "bench": "fsdp_memory",
                "preset": args.preset,
                "world_size": args.world_size,
                "measured_bytes_per_rank": {k: dict(v) for k, v in out.items()},
                "measured_ratio_fsdp_to_ddp": round(measured["fsdp"] / measured["ddp"], 4),
                "gptlab_size_ratio": round(predicted["fsdp"] / predicted["ddp"], 4),
            }
        )
    )


if __name__ == "__main__":
    main()
