"""Contract B: an objective's ``step_metrics()`` reach metrics.jsonl, the progress line and loss.png."""

from __future__ import annotations

import pytest
import torch

from gptlab.data import prepare
from gptlab.train import loop as gtrain
from gptlab.train import objectives
from gptlab.train.config import build_config
from gptlab.train.metrics import Progress, read_metrics, step_metric_panels
from tests._tiny import TINY_TRAIN


class CountingLM(objectives.CausalLM):
    """Next-token prediction that reports its micro-batches' mean loss and a count, per step."""

    def _setup(self) -> None:
        super()._setup()
        self.sums: list[torch.Tensor] = []
        self.calls = 0

    def loss(self, forward, batch):
        loss = super().loss(forward, batch)
        self.sums.append(loss.detach())
        return loss

    def step_metrics(self) -> dict[str, torch.Tensor | float]:
        self.calls += 1
        out = {"mean/loss": torch.stack(self.sums).mean(), "mean/twice": 2 * torch.stack(self.sums).mean()}
        self.sums = []
        return {**out, "calls": float(self.calls)}


@pytest.fixture
def counting(monkeypatch):
    monkeypatch.setitem(objectives.OBJECTIVES, "counting", CountingLM)


def test_step_metrics_are_logged_per_step_and_plotted(counting, tmp_path):
    (tmp_path / "c.txt").write_text("the quick brown fox jumps over the lazy dog\n" * 200)
    prepare([tmp_path / "c.txt"], tmp_path / "ds", block_size=16)
    cfg = build_config(
        None,
        [*TINY_TRAIN, "objective=counting", "max_steps=6", "log_every=3", "grad_accum=2", "eval_every=6"],
    )
    gtrain.train(cfg, tmp_path / "ds", tmp_path / "run")
    steps = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if "loss" in r]
    assert [r["calls"] for r in steps] == [1, 2, 3, 4, 5, 6]  # once per optimizer step, read in batches of 3
    for r in steps:  # the loop's loss is the mean of the micro-batches' losses: the objective saw the same
        assert r["mean/loss"] == pytest.approx(r["loss"], rel=1e-5)
        assert r["mean/twice"] == pytest.approx(2 * r["loss"], rel=1e-5)
    assert step_metric_panels(steps) == {"mean": ["mean/loss", "mean/twice"], "calls": ["calls"]}
    assert (tmp_path / "run" / "loss.png").stat().st_size > 0
    line = Progress(1, 0, False, 1, 1.0, None).postfix(1.0, 0.1, {"mean/loss": 0.51234})
    assert "mean/loss 0.512" in line
    # gptlab compare --metric: any logged key over training, across runs
    from gptlab.cli import main
    from gptlab.errors import GptlabError

    out = tmp_path / "cmp.png"
    assert (
        main(["compare", str(tmp_path / "run"), "--metric", "mean/loss,mean/twice", "--out", str(out)]) == 0
    )
    assert out.stat().st_size > 0
    with pytest.raises(GptlabError, match="no run logged 'nope'.*mean/loss"):
        from gptlab.evaluate.compare import load_runs, plot_runs

        plot_runs(load_runs([tmp_path / "run"]), out, metrics=["nope"])
