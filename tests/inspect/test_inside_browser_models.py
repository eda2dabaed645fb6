"""The Inside view in headless Chromium for the other architectures, checked against Python to 1e-4.

* An encoder–decoder served by ``gptlab serve``: the page offers its three kinds of attention
  (the decoder's self-attention, cross-attention target × source, the encoder's self-attention);
  a hovered cross-attention weight equals ``seq2seq_maps``.
* A masked-language encoder served by ``gptlab serve``: the page offers no generation controls and
  fills ``[MASK]`` (equal to ``fill_masks``); Inside reads the first ``[MASK]``, shows the full
  bidirectional matrix (a weight above the diagonal is non-zero and equals ``attention_maps``),
  and picking another position reads the lens there (equal to ``head(norm_f(h⁽ˡ⁾_i))``).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest
import torch

import gptlab
from bench import serve_load
from gptlab import GPTConfig
from gptlab.inspect import attention_maps
from gptlab.inspect.attention import seq2seq_maps
from gptlab.inspect.fill import MASK, fill_masks
from gptlab.model import build_model
from gptlab.tokenizers import CharTokenizer
from gptlab.train.objectives import with_mask_token
from tests._browser import chromium_page

ALPHABET = "abcdefghijklmnopqrstuvwxyz .,:"
ATT = 70  # the canvas's left and top margins (inside.js: ATT)


def checkpoint(folder: Path, arch: str, tok: CharTokenizer) -> Path:
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=tok.vocab_size, block_size=48, n_layer=2, n_head=2, n_embd=32, init_std=0.2, arch=arch
    )
    return gptlab.save(build_model(config), tok, folder / arch)


@pytest.fixture
def served(tmp_path: Path):
    """``serve(arch, tok)`` → (URL, the same model loaded here in float32, its tokenizer)."""

    @contextlib.contextmanager
    def serve(arch: str, tok: CharTokenizer):
        ckpt = checkpoint(tmp_path, arch, tok)
        extra = ["--device", "cpu", "--dtype", "fp32"]
        with serve_load.serve(str(ckpt), max_batch=2, extra=extra, timeout=60) as url:
            model, loaded = gptlab.load(ckpt, device="cpu", quantize="fp32")
            yield url, model.eval(), loaded

    threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        yield serve
    finally:
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = threads


def open_inside(page, expect, text: str) -> None:
    expect(page.locator("#model")).to_contain_text("max tokens", timeout=60_000)
    page.fill("#prompt", text)
    page.click("#inside-open")
    expect(page.locator("#inside")).to_have_attribute("data-ready", "1", timeout=60_000)


def hover_weight(page, expect, kind: str, layer: int, head: int, i: int, j: int) -> float:
    """Pick ``kind``, ``layer`` and ``head``, hover cell (query i, key j) and read the weight shown."""
    if page.locator("#inside-kind-label").is_visible():
        page.select_option("#inside-kind", kind)
    page.select_option("#inside-layer", str(layer))
    page.select_option("#inside-head", str(head))
    expect(page.locator("#inside-attn-caption")).to_contain_text(f"layer {layer}, head {head}")
    cell = page.evaluate(f"attnGeometry(gptlabInside.attn['{kind}:{layer}']).cell")
    page.locator("#inside-attn").hover(
        position={"x": ATT + j * cell + cell / 2, "y": ATT + i * cell + cell / 2}
    )
    readout = page.locator("#inside-attn-readout")
    expect(readout).to_have_attribute("data-key", str(j))
    shown = readout.evaluate("e => ({...e.dataset})")
    assert (int(shown["layer"]), int(shown["head"]), int(shown["query"])) == (layer, head, i)
    return float(shown["weight"])


def test_an_encoder_decoder_shows_self_and_cross_attention(served) -> None:
    tok = CharTokenizer.from_text(ALPHABET, special_tokens=["<|endoftext|>"])
    source = "the cat sat"
    with served("encoder-decoder", tok) as (url, model, tok), chromium_page(url) as (page, expect, external):
        open_inside(page, expect, source)
        kinds = page.locator("#inside-kind option").evaluate_all("els => els.map(e => e.value)")
        assert (
            sorted(kinds) == ["cross", "encoder", "self"] and page.locator("#inside-kind-label").is_visible()
        )
        maps = seq2seq_maps(model, tok, source, target=[])  # the decoder reads BOS only
        S = len(tok.encode(source))
        assert list(maps["cross"].shape) == [2, 2, 1, S]
        got = hover_weight(page, expect, "cross", 1, 1, 0, 4)
        assert got == pytest.approx(float(maps["cross"][1, 1, 0, 4]), abs=1e-4) and got > 0
        expect(page.locator("#inside-attn-caption")).to_contain_text("cross-attention")
        assert page.locator("#inside-attn").evaluate("c => c.width") > page.locator("#inside-attn").evaluate(
            "c => c.height"
        )  # target × source: one row, S columns
        got = hover_weight(page, expect, "encoder", 0, 1, 1, 6)  # the encoder sees both sides
        assert got == pytest.approx(float(maps["encoder"][0, 1, 1, 6]), abs=1e-4) and got > 0
        got = hover_weight(page, expect, "self", 1, 0, 0, 0)
        assert got == pytest.approx(float(maps["decoder"][1, 0, 0, 0]), abs=1e-4) == 1.0  # BOS sees itself
        assert external == []


def test_a_masked_language_encoder_fills_and_shows_its_bidirectional_matrix(served) -> None:
    tok = with_mask_token(CharTokenizer.from_text(ALPHABET))
    text = f"the c{MASK}t sat on the mat"
    with served("encoder", tok) as (url, model, tok), chromium_page(url) as (page, expect, external):
        expect(page.locator("#model")).to_contain_text("max tokens", timeout=60_000)
        for gone in ("#generate", "#tab-chat", "#temperature", "#max_tokens", "#stopbtn", "#seed"):
            expect(page.locator(gone)).to_be_hidden()
        expect(page.locator("#fill")).to_be_visible()
        assert MASK in page.locator("#prompt").input_value()  # the page starts from a text to fill

        # Fill: the best guess at each mask, its probability and the top 5 as fill_masks computes them
        page.fill("#prompt", text)
        page.click("#fill")
        filled = page.locator("#output .filled")
        expect(filled).to_have_count(1, timeout=20_000)
        (want,), _ = fill_masks(model, tok, text, top_k=5)
        assert int(filled.get_attribute("data-position")) == want.position == 5
        assert filled.inner_text() == want.top[0][0]
        assert float(filled.get_attribute("data-prob")) == pytest.approx(want.top[0][1], abs=1e-4)
        filled.hover()
        assert page.locator("#tooltip").inner_text().count("%") == 5

        # Inside: at the first [MASK], with the full matrix
        page.click("#inside-open")
        expect(page.locator("#inside")).to_have_attribute("data-ready", "1", timeout=60_000)
        assert page.locator("#inside-position").input_value() == "5"
        expect(page.locator("#inside-dist-title")).to_contain_text("P(x_i | x̃)")
        expect(page.locator("#inside-predicts")).to_contain_text("[MASK]")
        ids = tok.encode(text, allowed_special="all")
        maps = attention_maps(model, tok, ids)
        got = hover_weight(page, expect, "self", 1, 1, 0, 9)  # query 0, key 9: above the diagonal
        assert got > 0 and got == pytest.approx(float(maps[1, 1, 0, 9]), abs=1e-4)
        assert "masked future" not in page.locator("#inside-attn-caption").inner_text()
        assert "+ M" not in page.locator("#inside-attn-eq").inner_text()  # no mask
        expect(page.locator("#inside-attn-caption")).to_contain_text("bidirectional self-attention")

        def lens_matches(position: int) -> None:
            with torch.no_grad():
                out = model.run(torch.tensor([ids]), output_hidden_states=True)
                rows = page.locator("#inside-lens tr[data-layer]")
                assert rows.count() == len(out.hidden_states) == 3
                for layer, h in enumerate(out.hidden_states):
                    p = torch.softmax(model.lm_head(model.norm_f(h[0, position])), dim=-1)
                    cells = rows.nth(layer).locator(".lens-cell")
                    shown = cells.evaluate_all("els => els.map(e => [+e.dataset.id, +e.dataset.prob])")
                    want_p, want_i = p.topk(len(shown))
                    assert [s[1] for s in shown] == pytest.approx(want_p.tolist(), abs=1e-4)
                    assert [s[0] for s in shown] == want_i.tolist()

        lens_matches(5)
        page.select_option("#inside-position", "2")  # another position: asked again, lens read there
        expect(page.locator("#inside")).to_have_attribute("data-position", "2", timeout=30_000)
        lens_matches(2)
        assert page.locator("#inside-stages .chip.chosen sub").inner_text() == str(ids[2])
        assert external == []
