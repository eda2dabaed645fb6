"""The issue's yardstick, runnable here: a minimal nanoGPT-style implementation of the reference run.

    python bench/baseline_minimal.py [--data FILE] [--max-steps N]

Prints ONE JSON line. The model and loop are written the way the well-known minimal
implementation writes them (one file, fp32 on CPU, SDPA with is_causal, LayerNorm with
bias, exact GELU, tied head, AdamW with decay on matrices, cosine schedule with warmup,
gradient clipping, random windows from a uint16 memmap) in the reference configuration:
4 layers, 4 heads, d_model 128, context 64, batch 12, lr 1e-3 → 1e-4. Timing is per
iteration (batch, forward, backward, step), as that implementation logs it; the
``steady_ms_per_step`` is the mean after the first 20 iterations. Run it next to
``train_shakespeare_char.py --recipe reference`` to compare on the same machine state.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

DEFAULT_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tinyshakespeare.txt"
N_LAYER, N_HEAD, N_EMBD, BLOCK, BATCH = 4, 4, 128, 64, 12


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.c_attn = nn.Linear(N_EMBD, 3 * N_EMBD)
        self.c_proj = nn.Linear(N_EMBD, N_EMBD)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, N_HEAD, C // N_HEAD).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln_1, self.attn = nn.LayerNorm(N_EMBD), Attention()
        self.ln_2 = nn.LayerNorm(N_EMBD)
        self.mlp = nn.Sequential(nn.Linear(N_EMBD, 4 * N_EMBD), nn.GELU(), nn.Linear(4 * N_EMBD, N_EMBD))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class MinimalGPT(nn.Module):
    def __init__(self, vocab: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, N_EMBD), nn.Embedding(BLOCK, N_EMBD)
        self.h = nn.ModuleList(Block() for _ in range(N_LAYER))
        self.ln_f = nn.LayerNorm(N_EMBD)
        self.lm_head = nn.Linear(N_EMBD, vocab, bias=False)
        self.lm_head.weight = self.wte.weight
        for m in self.modules():
            if isinstance(m, nn.Linear | nn.Embedding):
                nn.init.normal_(m.weight, 0.0, 0.02)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


class MinimalRun:
    """The reference run, one iteration at a time: ``step(it)`` is one batch, forward, backward and
    AdamW step at the cosine schedule's ``lr(it)``; returns the loss (read, as that loop logs it)."""

    def __init__(self, data: str | Path = DEFAULT_DATA, max_steps: int = 2000, seed: int = 1337) -> None:
        torch.manual_seed(seed)
        text = Path(data).read_text(encoding="utf-8")
        chars = sorted(set(text))
        lookup = {c: i for i, c in enumerate(chars)}
        ids = np.fromiter((lookup[c] for c in text), dtype=np.uint16, count=len(text))
        self.train = ids[: int(0.9 * len(ids))]
        self.max_steps = max_steps
        self.model = MinimalGPT(len(chars))
        params = [p for p in self.model.parameters() if p.requires_grad]
        groups = [
            {"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
            {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
        ]
        self.opt = torch.optim.AdamW(groups, lr=1e-3, betas=(0.9, 0.99))

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        ix = torch.randint(len(self.train) - BLOCK, (BATCH,))
        x = torch.stack([torch.from_numpy(self.train[i : i + BLOCK].astype(np.int64)) for i in ix])
        y = torch.stack([torch.from_numpy(self.train[i + 1 : i + 1 + BLOCK].astype(np.int64)) for i in ix])
        return x, y

    def lr(self, it: int) -> float:
        if it < 100:
            return 1e-3 * (it + 1) / 101
        ratio = (it - 100) / (2000 - 100)
        return 1e-4 + 0.5 * (1 + math.cos(math.pi * min(ratio, 1.0))) * (1e-3 - 1e-4)

    def step(self, it: int) -> float:
        for g in self.opt.param_groups:
            g["lr"] = self.lr(it)
        x, y = self.batch()
        loss = self.model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", default=str(DEFAULT_DATA))
    p.add_argument("--max-steps", type=int, default=2000)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    run = MinimalRun(args.data, args.max_steps)
    times = []
    t_start = time.perf_counter()
    for it in range(args.max_steps):
        t0 = time.perf_counter()
        last = run.step(it)
        times.append(time.perf_counter() - t0)
    wall = time.perf_counter() - t_start
    steady = statistics.fmean(times[20:] if len(times) > 20 else times)  # mean, as train_shakespeare_char
    print(
        json.dumps(
            {
                "implementation": "minimal (nanoGPT-style, fp32 eager)",
                "steps": args.max_steps,
                "steady_ms_per_step": round(1000 * steady, 2),
                "steady_tokens_per_s": round(BATCH * BLOCK / steady, 1),
                "train_wall_s": round(wall, 2),
                "last_loss": round(last, 4),
                "threads": torch.get_num_threads(),
                "loadavg_at_start": round(os.getloadavg()[0], 2),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
