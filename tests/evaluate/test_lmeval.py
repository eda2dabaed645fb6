"""lm-evaluation-harness drives gptlab: the ``gptlab`` model in-process, ``local-completions`` against a live
``gptlab serve``, and ``gptlab eval --tasks``, on a tiny model and the offline tasks of ``evals/``.

Each figure is checked against a plain forward pass of the model (log p(y | x) = Σ log softmax), and the
server's figures against the in-process ones: two independent paths (a shared-context KV cache there, one
echo forward pass per request here) that must agree per item within 1e-4.
"""

from __future__ import annotations

import importlib.util
import os
import tomllib

import pytest
import torch
import torch.nn.functional as F

import gptlab
from gptlab import GPT
from gptlab.evaluate.scoring import rolling_windows
from gptlab.generate import SampleConfig, generate_text
from tests import ROOT
from tests.evaluate._lmeval import BLOCK, EVALS, TASKS, require, samples


@pytest.fixture(scope="module", autouse=True)
def offline() -> None:
    require("lm_eval")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="module")
def loaded(checkpoint):
    model, tok = gptlab.load(checkpoint)
    return model.float().eval(), tok


def evaluate(model: str, model_args: str, limit: int | None = None) -> dict:
    import lm_eval
    from lm_eval.tasks import TaskManager

    import gptlab.evaluate.harness  # noqa: F401  (registers "gptlab")

    return lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=TASKS,
        task_manager=TaskManager(
            include_path=str(EVALS), include_defaults=False
        ),  # no indexing of lm-eval's own
        log_samples=True,
        limit=limit,
    )


def plain_logprob(model: GPT, context: list[int], continuation: list[int]) -> tuple[float, bool]:
    """One forward pass over x ⧺ y, cut to its last BLOCK + 1 tokens (as lm-eval's HF backend cuts)."""
    full = (context + continuation)[-(BLOCK + 1) :]
    with torch.no_grad():
        logp = F.log_softmax(model(torch.tensor([full[:-1]]))[0].float(), dim=-1)
    rows = logp[len(full) - len(continuation) - 1 :]
    target = torch.tensor(continuation)
    return float(rows.gather(-1, target[:, None]).sum()), bool((rows.argmax(-1) == target).all())


@pytest.fixture(scope="module")
def in_process(checkpoint) -> dict:
    return evaluate("gptlab", f"pretrained={checkpoint},dtype=fp32,device=cpu")


def test_lm_eval_drives_the_gptlab_model(in_process, loaded):
    model, tok = loaded
    choice = samples(in_process, "gptlab_choice")
    assert len(choice) == 40
    hits = 0
    for s in choice:
        scores = [resp[0][0] for resp in s["resps"]]
        for (context, continuation), (logprob, greedy) in zip(
            s["arguments"], (r[0] for r in s["resps"]), strict=True
        ):
            expected = plain_logprob(model, tok.encode(context), tok.encode(continuation))
            assert logprob == pytest.approx(expected[0], abs=1e-4) and greedy == expected[1]
        hits += int(max(range(len(scores)), key=scores.__getitem__) == s["target"])
    assert in_process["results"]["gptlab_choice"]["acc,none"] == pytest.approx(hits / 40)

    for s in samples(in_process, "gptlab_rolling"):  # longer than the context: several windows
        ids = tok.encode(s["arguments"][0][0])
        windows = rolling_windows(ids, tok.eot_id, BLOCK)
        assert len(windows) > 1
        expected = sum(plain_logprob(model, ctx, cont)[0] for ctx, cont in windows)
        assert s["resps"][0][0] == pytest.approx(expected, abs=1e-3)

    stop = SampleConfig(max_new_tokens=16, temperature=0, stop=[".", "\n"], slide=False)
    for s in samples(in_process, "gptlab_gen"):
        assert s["resps"][0][0] == generate_text(model, tok, s["arguments"][0][0], stop)


def test_local_completions_against_gptlab_serve(in_process, checkpoint):
    """lm-eval's own OpenAI client, tokenizing through /tokenize, against a live server: the same figures."""
    from bench import serve_load

    with serve_load.serve(
        str(checkpoint), 4, ["--model-name", "tiny", "--device", "cpu", "--dtype", "fp32"]
    ) as url:
        args = (
            f"model=tiny,base_url={url}/v1/completions,tokenizer_backend=remote,tokenized_requests=True,"
            f"max_length={BLOCK + 1},num_concurrent=1,max_retries=1"
        )
        served = evaluate("local-completions", args)
    # lm-eval's API backend keeps max_length tokens of x ⧺ y (the HF one and gptlab: max_length + 1) and
    # predicts rolling windows of max_length - 1: in-process with max_length - 1 is the same computation
    same = evaluate("gptlab", f"pretrained={checkpoint},dtype=fp32,max_length={BLOCK - 1}")
    for a, b in zip(samples(same, "gptlab_choice"), samples(served, "gptlab_choice"), strict=True):
        ours, theirs = (r[0] for r in a["resps"]), (r[0] for r in b["resps"])
        for (lp_a, greedy_a), (lp_b, greedy_b) in zip(ours, theirs, strict=True):
            assert lp_b == pytest.approx(lp_a, abs=1e-4) and greedy_b == greedy_a
    for a, b in zip(samples(same, "gptlab_rolling"), samples(served, "gptlab_rolling"), strict=True):
        assert b["resps"][0][0] == pytest.approx(a["resps"][0][0], abs=1e-3)
    assert served["results"]["gptlab_choice"] == pytest.approx(same["results"]["gptlab_choice"])
    gen = zip(samples(in_process, "gptlab_gen"), samples(served, "gptlab_gen"), strict=True)
    assert all(a["resps"] == b["resps"] for a, b in gen)


def test_gptlab_eval_tasks_prints_lm_evals_table(checkpoint, capsys):
    from gptlab.cli import main

    assert (
        main(["eval", str(checkpoint), "--tasks", "gptlab_choice", "--limit", "4", "--dtype", "float32"]) == 0
    )
    out = capsys.readouterr().out
    assert "gptlab_choice" in out and "acc" in out and "|" in out
    assert main(["eval", str(checkpoint), "--tasks", "no_such_task"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: unknown task(s) no_such_task")


def test_without_lm_eval_tasks_say_how_to_install(checkpoint, capsys, monkeypatch):
    from gptlab.cli import main
    from gptlab.evaluate import tasks

    real = importlib.util.find_spec
    monkeypatch.setattr(
        tasks.importlib.util, "find_spec", lambda name: None if name == "lm_eval" else real(name)
    )
    assert main(["eval", str(checkpoint), "--tasks", "gptlab_choice"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'gptlab[eval]'" in err[0]


def test_pyproject_declares_the_eval_extra():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["optional-dependencies"]["eval"] == ["lm-eval[api]==0.4.13"]
    assert project["entry-points"]["lm_eval.models"] == {"gptlab": "gptlab.evaluate.harness:GptlabLM"}
    assert set(project["scripts"]) == {"gptlab"}  # `lm_eval --model gptlab` (tests/test_lmeval_command.py)


def test_a_setting_in_model_args_and_lm_evals_options_is_taken_once(checkpoint):
    """``--model_args device=cpu`` beside lm-eval's own ``--device``: model_args win, no TypeError."""
    from gptlab.evaluate.harness import GptlabLM

    lm = GptlabLM.create_from_arg_string(
        f"pretrained={checkpoint},dtype=fp32,device=cpu", {"device": "cuda:0", "batch_size": None}
    )
    assert next(lm.model.parameters()).device.type == "cpu"
