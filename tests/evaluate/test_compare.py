"""gptlab compare: several runs' curves on one PNG, and their final figures in a table."""

from __future__ import annotations

import json

import pytest

from gptlab.cli import main
from gptlab.data import prepare
from gptlab.evaluate.compare import load_runs, plot_runs, render_table
from gptlab.train import train
from gptlab.train.config import build_config
from gptlab.train.metrics import read_metrics
from tests._tiny import TINY_TRAIN


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare")
    (root / "c.txt").write_text("\n".join(f"all the world's a stage {i % 13}" for i in range(400)))
    prepare([root / "c.txt"], root / "ds", block_size=16)
    common = [*TINY_TRAIN, "eval_every=2"]
    train(build_config(None, [*common, "max_steps=4", "batch_size=4"]), root / "ds", root / "a")
    train(build_config(None, [*common, "max_steps=6", "batch_size=2", "lr=1e-2"]), root / "ds", root / "b")
    return root / "a", root / "b"


def test_compare_prints_each_runs_final_figures_and_draws_one_png(capsys, runs, tmp_path):
    a, b = runs
    out = tmp_path / "plots" / "cmp.png"
    assert main(["compare", str(a), str(b), "--x", "tokens", "--out", str(out), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and result["plot"] == str(out)
    rows = {r["run"]: r for r in result["runs"]}
    for run, steps, batch in ((a, 4, 4), (b, 6, 2)):
        records = read_metrics(run / "metrics.jsonl")
        evals = [r for r in records if "val_loss" in r]
        row = rows[run.name]
        assert row["steps"] == steps and row["tokens"] == steps * batch * 16
        assert row["val loss"] == evals[-1]["val_loss"]
        assert row["best val"] == min(r["val_loss"] for r in evals)
        assert row["train loss"] == [r for r in records if "loss" in r][-1]["loss"]
        assert row["tok/s"] == pytest.approx(row["tokens"] / row["seconds"])
    assert main(["compare", str(a), str(b), "--x", "seconds", "--out", str(tmp_path / "s.png")]) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split()[:3] == ["run", "steps", "tokens"]
    assert sum(line.startswith(("a ", "b ")) for line in text.splitlines()) == 2
    assert f"plot: {tmp_path / 's.png'}" in text


def test_every_x_axis_places_every_point(runs, tmp_path):
    curves = load_runs(list(runs))
    for axis in ("steps", "tokens", "seconds"):
        for run in curves:
            xs = [run.x(r, axis) for r in run.steps]
            assert None not in xs and xs == sorted(xs)  # per-step records: in order on every axis
            at_step = {r["step"]: run.x(r, axis) for r in run.steps}
            assert [run.x(r, axis) for r in run.evals] == [at_step[r["step"]] for r in run.evals]
        assert plot_runs(curves, tmp_path / f"{axis}.png", axis).stat().st_size > 1000
    table = render_table([r.final() for r in curves])
    assert len({len(line) for line in table.splitlines()}) == 1  # aligned columns


def test_compare_refuses_what_is_not_a_run(capsys, runs, tmp_path):
    code = main(["compare", str(runs[0]), str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no metrics.jsonl records" in err
    assert main(["compare", str(runs[0]), "--x", "hours"]) == 2
