"""A compiled training step paid for once: a later process finds the traced forward and backward
in AOTAutograd's on-disk cache, our autograd.Functions (the GELU) included, and trains the same."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gptlab import compiling
from tests._tiny import TINY_TRAIN

ROOT = Path(__file__).resolve().parents[2]

CHILD = """
import json, sys
from pathlib import Path
import torch._dynamo.utils as du
from gptlab.train import loop as gtrain
from gptlab.train.config import build_config
from gptlab.train.metrics import read_metrics
data, run, overrides = Path(sys.argv[1]), Path(sys.argv[2]), json.loads(sys.argv[3])
gtrain.train(build_config(None, overrides), data, run)
losses = [r["loss"] for r in read_metrics(run / "metrics.jsonl") if "loss" in r]
print(json.dumps({"aot_autograd": dict(du.counters["aot_autograd"]), "losses": losses}))
"""


def _train_in_a_process(dataset: Path, run: Path, cache: Path) -> dict:
    overrides = [*TINY_TRAIN, "batch_size=4", "device=cpu", "compile=true", "max_steps=3", "eval_every=3"]
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(cache), "PYTHONPATH": str(ROOT / "src")}
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(dataset), str(run), json.dumps(overrides)],
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    result: dict = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow  # a cold inductor compile of a training step, then a warm one: ~30 s on 2 cores
def test_a_second_process_finds_the_compiled_training_step_in_aotautograds_cache(dataset, tmp_path):
    """Without ``compile_caches`` AOTAutograd refuses the graph (it holds ``_CompiledGELU``) and the
    second process traces the joint graph again: ``autograd_cache_bypass`` instead of a hit."""
    if not compiling.can_compile("cpu"):
        pytest.skip("torch.compile needs a C++ compiler on CPU (none found)")
    cache = tmp_path / "inductor"
    first = _train_in_a_process(dataset, tmp_path / "first", cache)
    second = _train_in_a_process(dataset, tmp_path / "second", cache)
    assert first["aot_autograd"].get("autograd_cache_saved") == 1, first
    assert second["aot_autograd"].get("autograd_cache_hit") == 1, second
    assert "autograd_cache_bypass" not in second["aot_autograd"], second
    assert len(first["losses"]) == 3
    assert second["losses"] == first["losses"]  # the graph read back computes what the traced one did


def test_the_isa_probe_starts_early_only_where_something_will_compile(monkeypatch):
    from torch._inductor import cpu_vec_isa

    assert compiling.probe_cpu_isa_early("cuda") is None
    previous = compiling.configure(compile=False)
    try:
        assert compiling.probe_cpu_isa_early("cpu") is None
    finally:
        compiling.configure(compile=previous.compile, cxx=previous.cxx)
    if not compiling.can_compile("cpu"):
        pytest.skip("torch.compile needs a C++ compiler on CPU (none found)")
    calls = []
    monkeypatch.setattr(cpu_vec_isa, "valid_vec_isa_list", lambda: calls.append(1))
    thread = compiling.probe_cpu_isa_early("cpu")
    assert thread is not None and thread.daemon
    thread.join(timeout=60)
    assert calls == [1]  # inductor's own probe ran, in that thread


def test_a_training_step_compiled_for_a_cpu_calls_its_kernels_from_cpp(monkeypatch):
    """``cpp_wrapper`` on a CPU (a small model's step is mostly short kernels; their Python calls
    cost ~6 % of it, docs/benchmarks.md#training), inductor's defaults elsewhere."""
    import torch

    from gptlab.train import runtime

    seen: list = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: seen.append(kw.get("options")) or fn)
    monkeypatch.setattr(runtime, "can_compile", lambda device_type: True)
    runtime.compile_forward(torch.nn.Identity(), "cpu")
    runtime.compile_forward(torch.nn.Identity(), "cuda")
    assert seen == [{"cpp_wrapper": True}, None]
