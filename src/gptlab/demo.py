"""``gptlab demo``: prepare a character-level dataset, train the ``char-best`` recipe, print a sample.

Offline by default: the corpus is Python's own documentation text (``pydoc_data``). The tour of the
whole package, so it sits at the top, over the trainer, the checkpoint format and generation
(``docs/design/layers.md``), and only the CLI imports it.
"""

from __future__ import annotations

import os
import shutil
import time
import warnings
from pathlib import Path

from gptlab.errors import GptlabError

RECIPE = "char-best"


def _prepare(corpus: Path, data_dir: Path) -> dict:
    from gptlab.data import prepare

    try:
        return prepare([corpus], data_dir, tokenizer="char", progress=True)
    except GptlabError:
        if not (data_dir / "meta.json").exists():
            raise
        shutil.rmtree(data_dir)  # the demo's own dataset, made from another corpus
        return prepare([corpus], data_dir, tokenizer="char", progress=True)


def run_demo(
    out: str | os.PathLike[str] = "runs/demo",
    data: str | os.PathLike[str] | None = None,
    max_steps: int | None = None,
    overrides: list[str] | None = None,
) -> str:
    """Run the demo; return the sample text."""
    from gptlab.checkpoint import clear_run, load
    from gptlab.data.corpus import write_default_corpus
    from gptlab.train import train
    from gptlab.train.config import build_config

    t0 = time.perf_counter()
    out = Path(out)
    if data is None:
        corpus = write_default_corpus(out / "corpus.txt")
        print(f"corpus: Python's documentation text (pydoc_data, {corpus.stat().st_size:,} bytes, offline)")
    else:
        corpus = Path(data)
        if not corpus.is_file():
            raise GptlabError(f"{corpus}: no such file; --data takes one UTF-8 text file")
        print(f"corpus: {corpus} ({corpus.stat().st_size:,} bytes)")
    items = list(overrides or []) + ([f"max_steps={max_steps}"] if max_steps is not None else [])
    cfg = build_config(RECIPE, items)
    meta = _prepare(corpus, out / "data")
    print(
        f"dataset: {meta['train_tokens']:,} train / {meta['val_tokens']:,} val characters, "
        f"vocabulary {meta['vocab_size']}"
    )
    clear_run(out)  # the previous demo's checkpoints and records
    print(
        f"training: recipe {RECIPE}, {cfg.max_steps} steps "
        f"({cfg.model.get('n_layer', 4)} layers, d_model {cfg.model.get('n_embd', 128)}, "
        f"context {cfg.model.get('block_size', 64)}, {cfg.optimizer}, {cfg.dtype})"
    )
    result = train(cfg, out / "data", out)
    model, tok = load(out)
    sample = _sample(model, tok)
    context = model.config.block_size
    print(
        f"\nsampling at temperature 0.8; past {context} characters each one is predicted from the last {context}"
    )
    print("---- sample ----")
    print(sample)
    print("----------------")
    val = f"{result.val_loss:.3f}" if result.val_loss is not None else "n/a"
    print(
        f"val loss {val} after {result.step} steps ({result.tokens_per_s:,.0f} tokens/s, "
        f"{time.perf_counter() - t0:.0f} s in all)"
    )
    print(f"loss plot: {out / 'loss.png'}")
    print(f"checkpoint: {result.checkpoint}  (try: gptlab sample {out} --prompt ...)")
    return sample


def _sample(model, tok, n: int = 400) -> str:  # type: ignore[no-untyped-def]
    """``n`` characters at temperature 0.8; past the context, over a sliding window (said before the
    sample, so generation's own ``ContextWarning`` is not repeated as a warning)."""
    from gptlab.generate import ContextWarning, SampleConfig, generate_text

    prompt = "\n" if "\n" in getattr(tok, "chars", ["\n"]) else tok.decode([0])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ContextWarning)
        text = generate_text(model, tok, prompt, SampleConfig(max_new_tokens=n, temperature=0.8, seed=0))
    return prompt + text
