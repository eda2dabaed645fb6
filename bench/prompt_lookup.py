"""Prompt-lookup decoding against plain decoding, where the answer copies its input and where it does not.

    python bench/prompt_lookup.py                               # SmolLM2-135M-Instruct, bf16, 2 rounds
    python bench/prompt_lookup.py --dtype fp32 --compile on --rounds 3

Each task is one chat request, decoded greedily for ``--new-tokens`` tokens twice per round, with
``prompt_lookup="off"`` and ``"on"`` in turns (off, on, off, on, …; one warm-up of each first), in
one process. The texts are checked to be identical (prompt lookup never changes the output); the
line printed gives per task the median tokens per second of each, their ratio, and how many drafted
tokens were accepted.

Tasks: ``edit`` (correct the spelling of a paragraph: the answer is mostly the paragraph),
``extract`` (list the names in a text: the answer copies spans of it), ``code`` (rename a variable
in a function), and ``free`` (a story: nothing to copy, where prompt lookup must cost next to nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

PARAGRAPH = (
    "The old lighthouse stood at the edge of the cliff for more than a hundred yaers. Every nigth its "
    "keeper climbed the narrow stairs, lit the great lamp and watched the ships pass safely along the "
    "rocky coast. When the storm of the winter came, the keeper stayed awake for three days, and not a "
    "single ship was lost."
)
CODE = """def total_price(items, tax):
    subtotal = 0
    for item in items:
        subtotal = subtotal + item.price * item.quantity
    tax_amount = subtotal * tax
    return subtotal + tax_amount
"""
TASKS = {
    "edit": f"Correct the spelling mistakes in this text and write the whole corrected text:\n\n{PARAGRAPH}",
    "extract": (
        "Here are the minutes of a meeting. Alice Martin opened the meeting. Bob Chen presented the "
        "budget, and Carol Diaz asked about the travel costs. David Okafor answered for the finance "
        "team. Eva Novak closed the meeting.\n\nList every person named, one per line, with their role."
    ),
    "code": f"Rename the variable `subtotal` to `net` in this function and write the whole function:\n\n{CODE}",
    "free": "Write a short story about a dragon who learns to bake bread.",
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2", help="any model source (default: %(default)s)")
    p.add_argument("--dtype", default="bf16", choices=["fp32", "bf16", "int8"])
    p.add_argument("--compile", default="off", choices=["auto", "on", "off"])
    p.add_argument("--tasks", default=",".join(TASKS), help="comma-separated, of: " + ", ".join(TASKS))
    p.add_argument("--new-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    args = p.parse_args(argv)

    import torch

    import gptlab
    from gptlab.generate import generate_ids, prepare_decoding
    from gptlab.generate.config import SampleConfig
    from gptlab.generate.driver import decode_rows, start
    from gptlab.sources import load_source
    from gptlab.tokenizers.chat import encode_chat

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_source(args.model)
    gptlab.quantize(model, args.dtype)
    prepare_decoding(model, compile=args.compile, planned_tokens=None)
    out: dict[str, object] = {"model": args.model, "dtype": args.dtype, "compile": args.compile}
    for name in [t.strip() for t in args.tasks.split(",") if t.strip()]:
        ids = torch.tensor([encode_chat(tok, [{"role": "user", "content": TASKS[name]}])])

        def run(mode: str, ids: torch.Tensor = ids) -> tuple[float, list[int]]:
            t = time.perf_counter()
            row = generate_ids(model, ids, args.new_tokens, temperature=0.0, prompt_lookup=mode)
            return time.perf_counter() - t, row[0, ids.size(1) :].tolist()

        times: dict[str, list[float]] = {"off": [], "on": []}
        texts = {}
        for mode in ("off", "on"):
            _, texts[mode] = run(mode)  # warm-up
        if texts["off"] != texts["on"]:
            raise SystemExit(f"error: prompt lookup changed the greedy output of task {name!r}")
        for _ in range(args.rounds):
            for mode in ("off", "on"):
                times[mode].append(run(mode)[0])
        config = SampleConfig(max_new_tokens=args.new_tokens, temperature=0.0, prompt_lookup="on")
        session, rows = start(model, tok, ids.tolist(), config, None)
        for _ in decode_rows(session, rows):
            pass
        stats = rows[0].drafter.stats if rows[0].drafter is not None else None
        n = len(texts["on"])
        off, on = statistics.median(times["off"]), statistics.median(times["on"])
        out[name] = {
            "tokens": n,
            "plain_tokens_per_s": round(n / off, 1),
            "lookup_tokens_per_s": round(n / on, 1),
            "speedup": round(off / on, 2),
            "passes": None if stats is None else stats.passes,
            "drafted": None if stats is None else stats.drafted,
            "accepted": None if stats is None else stats.accepted,
        }
        print(f"{name}: {out[name]}", file=sys.stderr, flush=True)
    out |= {"capability": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
