"""The playground's Inside view in headless Chromium, driven as a user would, checked against Python.

A 4-layer character model is served by ``gptlab serve``; the page types a prompt, opens Inside,
picks layer 3 and head 2 and hovers a cell (the weight shown equals ``attention_maps``), moves
the sampling sliders with the keyboard (the bars equal ``Sampler.process`` of the same logits)
and reads the logit lens (equal to ``head(norm_f(h⁽ˡ⁾))`` computed here).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import torch

import gptlab
from bench import serve_load
from gptlab import GPT, GPTConfig
from gptlab.generate import SampleConfig
from gptlab.generate.sampling import Sampler
from gptlab.inspect import attention_maps
from gptlab.tokenizers import CharTokenizer
from tests._browser import TEXT, chromium_page

PROMPT = "ROMEO: Is the day so young?"


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    tok = CharTokenizer.from_text(TEXT)
    torch.manual_seed(0)
    config = GPTConfig(
        vocab_size=tok.vocab_size, block_size=64, n_layer=4, n_head=4, n_embd=64, pos="rope", init_std=0.2
    )
    return gptlab.save(GPT(config), tok, tmp_path_factory.mktemp("inside") / "char4")


@pytest.fixture(scope="module")
def served(checkpoint: Path):
    """The server's URL, and the same model loaded here in float32."""
    threads = os.environ.get("OMP_NUM_THREADS")
    os.environ["OMP_NUM_THREADS"] = "1"
    try:
        with serve_load.serve(
            str(checkpoint), max_batch=2, extra=["--device", "cpu", "--dtype", "fp32"], timeout=60
        ) as url:
            model, tok = gptlab.load(checkpoint, device="cpu", quantize="fp32")
            yield url, model.eval(), tok
    finally:
        if threads is None:
            os.environ.pop("OMP_NUM_THREADS", None)
        else:
            os.environ["OMP_NUM_THREADS"] = threads


def sampler_probs(logits: torch.Tensor, temperature: float, top_k: int, top_p: float, min_p: float):
    """The server's reading of the settings (0, 1.0, 0.0 are "off") through the sampler's steps."""
    config = SampleConfig(
        temperature=temperature, top_k=top_k or None, top_p=top_p if top_p < 1 else None, min_p=min_p or None
    )
    sampler = Sampler(config, logits.numel())
    if config.greedy:  # Sampler.choose takes the arg-max: all the probability on it
        return torch.nn.functional.one_hot(logits.argmax(), logits.numel()).float()
    return torch.softmax(sampler.process(logits, []), dim=-1)


def bars(page) -> list[dict]:
    return page.locator("#inside-bars .bar").evaluate_all(
        "els => els.map(e => ({id: +e.dataset.id, prob: +e.dataset.prob, kept: e.dataset.kept === '1', "
        "reason: e.dataset.reason}))"
    )


def press(page, selector: str, key: str, times: int) -> None:
    page.focus(selector)
    for _ in range(times):
        page.keyboard.press(key)


def test_inside_view_in_headless_chromium(served) -> None:
    url, model, tok = served
    ids = tok.encode(PROMPT)
    with torch.no_grad():
        out = model.run(torch.tensor([ids]), output_hidden_states=True)
    logits = out.logits[0, -1].float()
    maps = attention_maps(model, tok, PROMPT)
    with chromium_page(url) as (page, expect, external):
        expect(page.locator("#model")).to_contain_text("max tokens", timeout=60_000)
        page.fill("#prompt", PROMPT)
        page.click("#inside-open")
        expect(page.locator("#inside")).to_have_attribute("data-ready", "1", timeout=60_000)
        stages = page.locator("#inside-stages .stage")
        assert stages.evaluate_all("els => els.map(e => e.dataset.stage)") == [
            "tokens",
            "embedding",
            "position",
            "blocks",
            "final",
            "logits",
            "distribution",
        ]
        assert page.locator("#inside-stages .chip").count() == len(ids)
        guides = page.locator("#inside-stages .stage .guide").all_inner_texts()
        assert guides[:2] == ["inside.md#tokens", "inside.md#token-embeddings"] and len(guides) == 7
        assert "softmax(Q·Kᵀ/√d_k + M)" in page.locator("#inside-attn-eq").inner_text()

        # attention: layer 3, head 2, hover the cell (last query, key 7)
        page.select_option("#inside-layer", "3")
        expect(page.locator("#inside-attn-caption")).to_contain_text("layer 3, head 0")
        page.select_option("#inside-head", "2")
        expect(page.locator("#inside-attn-caption")).to_contain_text("layer 3, head 2")
        cell = page.evaluate("attnGeometry(gptlabInside.attn['self:3']).cell")
        i, j = len(ids) - 1, 7
        page.locator("#inside-attn").hover(
            position={"x": 70 + j * cell + cell / 2, "y": 70 + i * cell + cell / 2}
        )
        readout = page.locator("#inside-attn-readout")
        expect(readout).to_have_attribute("data-key", str(j))
        shown = readout.evaluate("e => ({...e.dataset})")
        assert (int(shown["layer"]), int(shown["head"]), int(shown["query"]), int(shown["key"])) == (
            3,
            2,
            i,
            j,
        )
        assert float(shown["weight"]) == pytest.approx(float(maps[3, 2, i, j]), abs=1e-4)
        assert float(maps[3, 2, i, j]) > 0  # a cell of the past, not the masked future

        # the distribution: the sliders start at the playground's settings; each move reshapes the bars
        def settings() -> tuple[float, int, float, float]:
            read = {
                k: page.locator(f"#inside-{k}").input_value()
                for k in ("temperature", "top_k", "top_p", "min_p")
            }
            return float(read["temperature"]), int(read["top_k"]), float(read["top_p"]), float(read["min_p"])

        def check() -> list[dict]:
            shown, want = bars(page), sampler_probs(logits, *settings())
            assert [b["prob"] for b in shown] == pytest.approx(
                [float(want[b["id"]]) for b in shown], abs=1e-4
            )
            assert [b["kept"] for b in shown] == [float(want[b["id"]]) > 0 for b in shown]
            return shown

        assert settings() == (0.8, 40, 0.95, 0.0)  # the playground's fields
        first = check()
        assert [b["id"] for b in first] == logits.topk(len(first)).indices.tolist()
        requests = []
        page.on("request", lambda r: requests.append(r.url))
        press(page, "#inside-top_p", "End", 1)  # 1.0: off
        press(page, "#inside-top_k", "Home", 1)  # 0: off
        press(page, "#inside-temperature", "ArrowLeft", 30)
        assert settings() == (0.5, 0, 1.0, 0.0)
        cooler = check()
        assert all(b["kept"] for b in cooler)
        assert cooler[0]["prob"] != pytest.approx(first[0]["prob"], abs=1e-3)
        press(page, "#inside-top_k", "ArrowRight", 3)
        topk = check()
        assert [b["kept"] for b in topk] == [True] * 3 + [False] * (len(topk) - 3)
        assert {b["reason"] for b in topk[3:]} == {"top-k"}
        press(page, "#inside-top_p", "ArrowLeft", 50)
        assert settings()[2] == 0.5
        check()
        press(page, "#inside-temperature", "Home", 1)  # τ = 0: greedy
        greedy = check()
        assert [b["prob"] for b in greedy] == [1.0] + [0.0] * (len(greedy) - 1)
        assert page.locator("#temperature").input_value() == "0"  # the playground's field follows
        assert requests == []  # no round trip for the sliders

        # the logit lens, against head(norm_f(h⁽ˡ⁾)) at the last position
        rows = page.locator("#inside-lens tr[data-layer]")
        assert rows.count() == 5
        for layer, h in enumerate(out.hidden_states):
            with torch.no_grad():
                p = torch.softmax(model.lm_head(model.norm_f(h[0, -1])), dim=-1)
            cells = rows.nth(layer).locator(".lens-cell")
            got = cells.evaluate_all("els => els.map(e => [+e.dataset.id, +e.dataset.prob])")
            want_p, want_i = p.topk(len(got))
            assert [g[0] for g in got] == want_i.tolist()
            assert [g[1] for g in got] == pytest.approx(want_p.tolist(), abs=1e-4)
        timing = page.evaluate("({...gptlabInside.timing})")
        assert timing["first_paint_ms"] > 0 and timing["slider_ms"] >= 0
        assert external == []


def test_grammar_panel_shows_the_allowed_tokens_at_each_step(served) -> None:
    """A regex in the Inside view's Grammar panel: the server writes the reply under it, one chip per
    step; the first step allows exactly "y" and "n", and its bars equal ``grammar_steps`` to 1e-4."""
    from gptlab.inspect.inside_grammar import constraint_config, grammar_steps

    url, model, tok = served
    regex = "(yes|no)[!?]"
    with chromium_page(url) as (page, expect, external):
        expect(page.locator("#model")).to_contain_text("max tokens", timeout=60_000)
        page.fill("#prompt", PROMPT)
        page.click("#inside-open")
        expect(page.locator("#inside")).to_have_attribute("data-ready", "1", timeout=60_000)
        expect(page.locator("#inside-grammar")).to_be_visible()
        page.select_option("#grammar-kind", "regex")
        page.fill("#grammar-source", regex)
        page.click("#grammar-run")
        expect(page.locator("#inside-grammar")).to_have_attribute("data-ready", "1", timeout=60_000)
        body = page.evaluate("gptlabInside.grammar.body")
        reply = [t["id"] for t in body["tokens"]]
        assert re.fullmatch(r"(yes|no)[!?]", tok.decode(reply))
        chips = page.locator("#grammar-tokens .gchip")
        assert chips.count() == len(body["steps"]) == len(reply) + 1  # the last: the grammar is done
        want = grammar_steps(model, tok, tok.encode(PROMPT), reply, constraint_config(regex=regex), top=10)
        page.locator('#grammar-tokens .gchip[data-step="0"]').click()
        expect(page.locator("#grammar-step")).to_have_attribute("data-step", "0")
        rows = page.locator('#grammar-step .gbar[data-allowed="1"][data-p-masked]')
        shown = rows.evaluate_all("els => els.map(e => [+e.dataset.id, +e.dataset.pMasked])")
        assert {i for i, _ in shown} == {tok.encode("y")[0], tok.encode("n")[0]}
        expected = {e["id"]: e["p_masked"] for e in want["steps"][0]["top_allowed"]}
        assert [p for _, p in shown] == pytest.approx([expected[i] for i, _ in shown], abs=1e-4)
        assert sum(p for _, p in shown) == pytest.approx(1.0, abs=1e-4)
        assert chips.nth(0).get_attribute("data-allowed") == "2"
        page.locator('#grammar-tokens .gchip[data-step="1"]').click()  # "e" or "o": forced
        expect(page.locator("#grammar-step")).to_contain_text("forced")
        assert external == []
