"""The GPU work: ``bench/gpu.py``, the ``gpt2-speedrun`` recipe, and checks that only a CUDA machine can run.

The CUDA tests skip, with the reason, where torch sees no GPU; everything that can run on the CPU
(the bench's logic in ``--smoke``, the recipe's shapes and options) runs here.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch

from bench import gpu
from gptlab.data import prepare
from gptlab.generate import generate_ids
from gptlab.generate.prepared import prepare_decoding, prepared_of
from gptlab.generate.static import StaticSession
from gptlab.model import GPT, GPTConfig
from gptlab.train import loop as gtrain
from gptlab.train.config import build_config
from tests._tiny import TINY_TRAIN

CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (torch sees none here)")


def test_bench_smoke_prints_one_json_line_per_figure(capsys):
    assert gpu.main(["--smoke", "--batches", "1,3", "--vocab-multiples", "64", "--fp8-layers", ""]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    figures = [r["figure"] for r in lines]
    assert figures == ["train", "train", "train", "decode", "decode", "serve"]
    nano, ours, chunked = lines[:3]
    assert nano["vocab"] == 512 and ours["vocab_multiple"] == 64
    assert (ours["loss_impl"], chunked["loss_impl"]) == ("plain", "chunked")
    assert chunked["last_loss"] == pytest.approx(ours["last_loss"], abs=1e-3)  # the same training
    assert ours["vs_baseline"] == pytest.approx(ours["tokens_per_s"] / nano["tokens_per_s"], rel=1e-2)
    assert all(r["static_path"] and r["tokens_per_s"] > 0 and r["hf_tokens_per_s"] > 0 for r in lines[3:5])
    assert [r["batch"] for r in lines[3:5]] == [1, 3]
    assert "skipped" in lines[5]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where there is no GPU")
def test_bench_without_a_gpu_says_so_in_one_line(capsys):
    assert gpu.main([]) == 2
    out = capsys.readouterr().out.strip()
    assert out.startswith("error:") and "CUDA" in out and "\n" not in out


def test_speedrun_recipe_has_the_modern_options_and_trains(tmp_path):
    cfg = build_config("gpt2-speedrun")
    model = cfg.model_config(50257)
    assert (model.n_layer, model.n_embd, model.block_size) == (12, 768, 1024)
    assert (model.pos, model.norm, model.mlp, model.qk_norm, model.zero_init_residual) == (
        "rope",
        "rmsnorm",
        "relu2",
        True,
        True,
    )
    assert cfg.optimizer == "muon" and cfg.compile == "auto" and model.padded_vocab_size == 50304
    # the same recipe, shrunk, trains on the CPU
    text = "\n".join("the quick brown fox jumps over a lazy dog " * 3 for _ in range(200))
    (tmp_path / "c.txt").write_text(text)
    prepare([tmp_path / "c.txt"], tmp_path / "ds", block_size=16)
    small = build_config(
        "gpt2-speedrun",
        [*TINY_TRAIN, "max_steps=4", "compile=false", "dtype=float32", "device=cpu", "eval_every=4"],
    )
    result = gtrain.train(small, tmp_path / "ds", tmp_path / "run")
    assert result.step == 4


# ---------------------------------------------------------------- CUDA only
def _cuda_model(**options) -> GPT:
    torch.manual_seed(0)
    config = GPTConfig(vocab_size=997, block_size=64, n_layer=2, n_head=4, n_embd=64, init_std=0.3, **options)
    return GPT(config).cuda().eval()


@CUDA
@pytest.mark.parametrize(
    "options", [dict(pos="learned"), dict(pos="rope", n_kv_head=2)], ids=["learned", "rope"]
)
def test_cuda_graph_path_equals_the_eager_path_in_float32(options):
    model = _cuda_model(**options)
    idx = torch.randint(0, 997, (3, 7), device="cuda")
    prepare_decoding(model, static=False)
    ref = generate_ids(model, idx, 24, temperature=0)
    prepare_decoding(model)  # the library default: CUDA graphs on CUDA
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*torch.compile failed")  # a fallback to eager
        got = generate_ids(model, idx, 24, temperature=0)
    session = prepared_of(model).static
    assert session.compiled, "the step did not run through torch.compile"
    assert torch.equal(got, ref)


@CUDA
def test_cuda_graph_buckets_serve_joins_and_leaves():
    from gptlab.generate import SampleConfig

    model = _cuda_model(pos="rope")
    greedy = SampleConfig(temperature=0)
    alone = StaticSession(model, 4, 48, step="eager")
    ((slot, first),) = alone.add_many([[5, 6, 7]], [greedy], [0])
    ref = [first] + [alone.step([slot])[slot] for _ in range(10)]
    session = StaticSession(model, 4, 48, step="cuda-graphs")
    got = {s: [t] for s, t in session.add_many([[1, 2], [5, 6, 7], [9]], [greedy] * 3, [0] * 3)}
    mine = sorted(got)[1]
    for i in range(10):
        if i == 3:
            session.remove(sorted(got)[0])
            got.pop(sorted(got)[0])
        for s, t in session.step(list(got)).items():
            got[s].append(t)
    assert session.compiled and got[mine] == ref
