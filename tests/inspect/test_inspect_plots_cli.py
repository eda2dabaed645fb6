"""Attention heatmaps and the trace / attention / size commands (bad input: ``error:``, status 2)."""

from __future__ import annotations

import json

import pytest
import torch
from PIL import Image

from gptlab import GPT, GPTConfig, GptlabError, save
from gptlab.cli import main
from gptlab.inspect import attention_maps, plot_head, plot_layer, plot_overview
from gptlab.inspect.inputs import token_labels
from gptlab.tokenizers import CharTokenizer

CORPUS = "The cat sat on the mat.\nA dog ran in the fog! $5 "
TEXT = "The cat sat on"


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(CORPUS)


@pytest.fixture(scope="module")
def model(tok, tiny_model) -> GPT:
    return tiny_model(vocab_size=tok.vocab_size, n_head=3, n_embd=24, init_std=0.3)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, model, tok):
    root = tmp_path_factory.mktemp("inspect")
    save(model, tok, root / "with-tok")
    save(model, None, root / "no-tok")
    return root


def _png(path) -> Image.Image:
    image = Image.open(path)
    image.load()  # decodes every byte: a truncated file fails here
    assert image.format == "PNG"
    assert len(image.convert("RGB").getcolors(1 << 24)) > 10  # a drawn heatmap, not a blank canvas
    return image


# ------------------------------------------------------------------ plots
def test_each_layout_writes_a_png_of_its_size(tmp_path, model, tok) -> None:
    maps = attention_maps(model, tok, TEXT)
    labels = token_labels(tok, tok.encode(TEXT))
    for name, draw in {
        "head": lambda p: plot_head(maps, labels, 1, 2, p),
        "layer": lambda p: plot_layer(maps, labels, 0, p),
        "overview": lambda p: plot_overview(maps, p),
    }.items():
        path = tmp_path / f"{name}.png"
        size = draw(path)
        assert _png(path).size == size
    # the overview is a layers × heads grid of 1.3-inch cells at 100 dpi, plus margins
    assert size == (3 * 130 + 60, 2 * 130 + 80)


def test_bigger_grids_give_bigger_images(tmp_path) -> None:
    small = plot_overview(torch.rand(2, 2, 5, 5).softmax(-1), tmp_path / "a.png")
    big = plot_overview(torch.rand(4, 6, 5, 5).softmax(-1), tmp_path / "b.png")
    assert big[0] > small[0] and big[1] > small[1]


@pytest.mark.parametrize(
    "call",
    [
        lambda m, p: plot_head(m, None, 2, 0, p),
        lambda m, p: plot_head(m, None, 0, 3, p),
        lambda m, p: plot_layer(m, None, -1, p),
        lambda m, p: plot_overview(m, p.with_suffix(".gif")),
    ],
)
def test_bad_plot_requests(tmp_path, call) -> None:
    with pytest.raises(GptlabError):
        call(torch.rand(2, 3, 4, 4), tmp_path / "x.png")


# -------------------------------------------------------------------- CLI
def test_trace_command(ckpt, capsys) -> None:
    assert main(["trace", str(ckpt / "with-tok"), TEXT, "--temperature", "0.5"]) == 0
    out = capsys.readouterr().out
    assert "7. Next token" in out and "τ = 0.5" in out
    assert main(["trace", str(ckpt / "with-tok"), TEXT, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["next_tokens"]) == 10 and len(data["layers"]) == 2
    assert sum(x["prob"] for x in data["next_tokens"]) <= 1.0 + 1e-6


def test_ids_work_without_a_tokenizer(ckpt, tok, capsys) -> None:
    ids = " ".join(map(str, tok.encode(TEXT)))
    assert main(["trace", str(ckpt / "no-tok"), "--ids", ids, "--json"]) == 0
    no_tok = json.loads(capsys.readouterr().out)
    assert main(["trace", str(ckpt / "with-tok"), TEXT, "--json"]) == 0
    with_tok = json.loads(capsys.readouterr().out)
    assert [x["prob"] for x in no_tok["next_tokens"]] == [x["prob"] for x in with_tok["next_tokens"]]


@pytest.mark.parametrize("layout", [[], ["--layer", "1"], ["--layer", "0", "--head", "2"]])
def test_attention_command(ckpt, tmp_path, layout, capsys) -> None:
    out = tmp_path / "attn.png"
    assert main(["attention", str(ckpt / "with-tok"), TEXT, "-o", str(out), *layout]) == 0
    assert "wrote" in capsys.readouterr().out
    _png(out)


def test_size_command(ckpt, tmp_path, capsys) -> None:
    assert main(["size", "--preset", "gpt2"]) == 0
    assert "124,439,808" in capsys.readouterr().out
    assert (
        main(["size", str(ckpt / "with-tok"), "--json", "--context", "16", "--batch", "2", "--dtype", "bf16"])
        == 0
    )
    data = json.loads(capsys.readouterr().out)
    total = next(f for f in data["parameters"] if f["name"] == "total")
    assert total["value"] == sum(p.numel() for p in GPT(GPTConfig.from_dict(data["config"])).parameters())
    assert main(["size", "--config", str(ckpt / "with-tok" / "config.json")]) == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["trace", "{root}/missing", TEXT],
        ["trace", "{root}/with-tok", ""],
        ["trace", "{root}/with-tok", "Zebra"],
        ["trace", "{root}/with-tok"],
        ["trace", "{root}/no-tok", TEXT],
        ["trace", "{root}/with-tok", "--ids", "1 two"],
        ["trace", "{root}/with-tok", "--ids", "999"],
        ["trace", "{root}/with-tok", TEXT, "--temperature", "-1"],
        ["attention", "{root}/with-tok", TEXT, "--layer", "5", "-o", "{root}/x.png"],
        ["attention", "{root}/with-tok", TEXT, "--layer", "0", "--head", "3", "-o", "{root}/x.png"],
        ["attention", "{root}/with-tok", TEXT, "--head", "0", "-o", "{root}/x.png"],
        ["attention", "{root}/with-tok", TEXT, "-o", "{root}/x.gif"],
        ["attention", "{root}/missing", TEXT, "-o", "{root}/x.png"],
        ["size", "--preset", "gpt5"],
        ["size"],
        ["size", "{root}/missing"],
        ["size", "--preset", "gpt2", "--dtype", "int3"],
        ["size", "--preset", "gpt2", "--context", "0"],
        ["size", "--config", "{root}/nothing.json"],
    ],
)
def test_bad_input_is_one_error_line(ckpt, argv, capsys) -> None:
    code = main([a.format(root=ckpt) for a in argv])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err


def test_unparseable_number_is_a_usage_error(ckpt, capsys) -> None:
    code = main(["attention", str(ckpt / "with-tok"), TEXT, "--layer", "one"])  # argparse's error: status 2
    assert code == 2 and capsys.readouterr().err.startswith("error: ")
