"""gptlab beside real llama.cpp on the same GGUF files: load, prefill, steady decode and memory.

    python bench/vs_llama_cpp.py                          # SmolLM2-135M-Instruct, every weight format, 2 rounds
    python bench/vs_llama_cpp.py --formats q4_1 --rounds 3 --new-tokens 64
    python bench/vs_llama_cpp.py --compile-cache DIR      # gptlab's kept compiled step (compiled first)

llama.cpp is npm's ``node-llama-cpp`` at the version ``make llama-cpp`` installs (its prebuilt CPU
binary), driven by ``tools/llama_cpp/bench.mjs``. Both engines read the *same* file and the *same*
token ids, greedy, batch 1, with ``--threads`` threads, each in a fresh process, in alternating
rounds (llama.cpp, gptlab, llama.cpp, gptlab, …), so a machine that drifts affects both alike.

The files: the shipped ``Q4_1`` file, and ``F32``, ``Q8_0`` and ``Q4_0`` files written from it by
``gptlab convert --to-gguf`` (once, into ``--work``). Each format is paired with gptlab's weights at
equal bits (``PAIRS``): F32 with float32, Q8_0 with int8, Q4_0 and Q4_1 with int4, each loaded as
``gptlab.load(file)`` loads it (the weights as the file ships them; the run stops if the format differs).

Per engine and round (fresh process):
    load_s        process spawn → model ready (interpreter or Node start, imports, reading the file)
    prefill_s     a ``--prompt-tokens`` prompt (Tiny Shakespeare) to its first generated token: the
                  first call in the process, then the second
    decode_tps    steady greedy decode after a 6-token prompt, tokens per second
    sampled_decode_tps  with ``--sampled``: the same decode sampled with llama.cpp's command-line
                  defaults (``SAMPLING``), once per process after the greedy ones (and after the memory
                  figures, which stay those of greedy decoding)
    rss_mb        resident memory after decoding; max_rss_mb the process's peak
    greedy_tokens_agreeing   how many of the decoded tokens the two engines agree on, from the first
With ``--compile-cache DIR`` each format's one-row step and prompt pass are compiled into DIR first
(``gptlab compile``, once, outside the rounds: ``compile_s``), and gptlab's processes load them there, as
a command under ``--compile auto`` does once they are kept (``prefill``: ``kept`` where the prefills ran
the kept compiled pass, ``eager`` otherwise; the run stops if the plan said kept and they did not).
The line printed holds each figure's median over the rounds and gptlab ÷ llama.cpp (for decode
llama.cpp ÷ gptlab is not used: every ratio is "gptlab's figure over llama.cpp's").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LLAMA_DIR = ROOT / ".cache" / "llama-cpp"
PROMPT = "The capital of France is"
# GGUF type → the gptlab weight format at equal bits
PAIRS = {"f32": "fp32", "q8_0": "int8", "q4_0": "int4", "q4_1": "int4"}
#: ``--sampled``: llama.cpp's command-line sampling defaults (``llama-cli``: temperature 0.8, top-k 40,
#: top-p 0.95, min-p 0.05), a fixed seed
SAMPLING = {"temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 1}


def source_file() -> Path:
    sys.path.insert(0, str(ROOT / "src"))
    from gptlab.interop.gguf import resolve

    return resolve("smollm2")


def gguf_files(work: Path, formats: list[str]) -> dict[str, Path]:
    """The shipped Q4_1 file and the other formats written from it (once: reused from ``work``)."""
    shipped = source_file()
    files, ckpt = {"q4_1": shipped}, work / "smollm2-f32"
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    for fmt in formats:
        if fmt in files:
            continue
        out = work / f"smollm2.{fmt.upper()}.gguf"
        if not out.exists():
            if not (ckpt / "config.json").exists():
                cmd = ["--from-gguf", str(shipped), "--out", str(ckpt)]
                subprocess.run([sys.executable, "-m", "gptlab", "convert", *cmd], check=True, env=env)
            cmd = ["--to-gguf", str(ckpt), "--type", fmt, "--out", str(out)]
            subprocess.run([sys.executable, "-m", "gptlab", "convert", *cmd], check=True, env=env)
        files[fmt] = out
    return files


def token_ids(model_file: Path, prompt_tokens: int) -> tuple[list[int], list[int]]:
    """(the long prefill prompt's ids, the short decode prompt's ids) from the file's own tokenizer."""
    sys.path.insert(0, str(ROOT / "src"))
    from gptlab.sources import source_tokenizer

    tok = source_tokenizer(model_file)
    text = (ROOT.parent / "shared" / "data" / "tinyshakespeare.txt").read_text(encoding="utf-8")[:20_000]
    return tok.encode(text)[:prompt_tokens], tok.encode(PROMPT)


def run_llama(job: dict) -> dict:
    started = time.time()
    done = subprocess.run(
        ["node", str(LLAMA_DIR / "bench.mjs")],
        input=json.dumps(job),
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(done.stdout)
    return {
        "load_s": out["loaded_at_ms"] / 1000 - started,
        "prefill_first_s": out["prefill_s"][0],
        "prefill_second_s": out["prefill_s"][1],
        "decode_tps": out["decode_tokens_per_s"],
        **({"sampled_decode_tps": out["sampled_decode_tokens_per_s"]} if job.get("sampling") else {}),
        "rss_mb": out["rss_mb"],
        "max_rss_mb": out["max_rss_mb"],
        "generated": out["generated"],
    }


def run_gptlab(job: dict, weights: str, compile_mode: str, cache: Path | None) -> dict:
    started = time.time()
    cmd = [
        sys.executable,
        __file__,
        "--worker",
        json.dumps(job),
        "--weights",
        weights,
        "--compile",
        compile_mode,
        *(["--compile-cache", str(cache)] if cache else []),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["load_s"] = out.pop("loaded_at") - started
    return out


def keep_step(job: dict, cache: Path) -> float:
    """``gptlab compile`` of the job's file into ``cache`` (what its gptlab rounds load) → seconds."""
    started = time.time()
    cmd = [sys.executable, "-m", "gptlab", "compile", job["model"], "--compile-cache", str(cache)]
    cmd += ["--threads", str(job["threads"]), "--weights-cache", "none", "--dtype", job["dtype"]]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return time.time() - started


def worker(job: dict, weights: str, compile_mode: str, cache: str | None = None) -> None:
    """One gptlab process: load the file, then the same measurements as ``bench.mjs``."""
    import torch

    import gptlab
    from gptlab.generate import generate_ids, prepare_decoding

    torch.set_num_threads(job["threads"])
    model, _ = gptlab.load(job["model"])  # a GGUF file's weights as it ships them (Q4 → int4, Q8_0 → int8)
    if getattr(model, "quantization", "fp32") != weights:
        raise SystemExit(f"error: {job['model']} loaded as {model.quantization}, not {weights}")
    engine = prepare_decoding(model, compile=compile_mode, compile_cache=cache)
    loaded_at = time.time()

    generated: list[int] = []

    def timed(ids: list[int], n: int, options: dict | None = None) -> float:
        t = time.perf_counter()
        out = generate_ids(model, torch.tensor([ids]), n, **(options or {"temperature": 0.0}))
        elapsed = time.perf_counter() - t
        generated[:] = out[0, len(ids) :].tolist()
        return elapsed

    prefill = [timed(job["prefill_ids"], 1) for _ in range(2)]
    n = job["new_tokens"]
    timed(job["decode_ids"], n)  # warm-up: a compiled step compiles here
    tokens = list(generated)
    decode = statistics.median(
        (n - 1) / (timed(job["decode_ids"], n) - timed(job["decode_ids"], 1)) for _ in range(3)
    )
    rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    sampled: dict[str, float] = {}
    if job.get("sampling"):  # the same decode, sampled as llama.cpp's command line samples by default
        ids, options = job["decode_ids"], job["sampling"]
        sampled["sampled_decode_tps"] = (n - 1) / (timed(ids, n, options) - timed(ids, 1, options))
    if cache and engine.plan(1).step == "fused" and engine.one_token.source != "loaded":
        raise SystemExit(f"error: the kept step in {cache} was not what ran: {engine.ran()}")
    prompt = engine.plan(1).prompt  # the prefills: the kept compiled pass where the cache keeps it
    if prompt == "kept" and engine.prompt.kept_calls < len(prefill):
        raise SystemExit(f"error: the kept prompt pass in {cache} was not what ran: {engine.prompts_ran()}")
    print(
        json.dumps(
            {
                "loaded_at": loaded_at,
                "prefill_first_s": prefill[0],
                "prefill_second_s": prefill[1],
                "prefill": prompt,
                "decode_tps": decode,
                **sampled,
                "rss_mb": rss,
                "max_rss_mb": max_rss,
                "generated": tokens,
            }
        )
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--formats", default="f32,q8_0,q4_0,q4_1", help="GGUF types, comma-separated (%(default)s)"
    )
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=505)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--compile", default="auto", help="gptlab's --compile (auto, on, off)")
    p.add_argument(
        "--sampled",
        action="store_true",
        help=f"also decode sampled as llama.cpp's command line does by default ({SAMPLING})",
    )
    p.add_argument(
        "--work", type=Path, default=ROOT / ".cache" / "vs-llama-cpp", help="where the GGUF files go"
    )
    p.add_argument(
        "--compile-cache",
        type=Path,
        help="keep gptlab's compiled one-row steps here (compiled first), and load them in the rounds",
    )
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(
            json.loads(args.worker),
            args.weights,
            args.compile,
            args.compile_cache and str(args.compile_cache),
        )
        return 0
    if not (LLAMA_DIR / "node_modules" / "node-llama-cpp").exists():
        raise SystemExit("error: llama.cpp is not installed: run `make llama-cpp` first")
    shutil.copyfile(ROOT / "tools" / "llama_cpp" / "bench.mjs", LLAMA_DIR / "bench.mjs")  # this checkout's
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    unknown = sorted(set(formats) - set(PAIRS))
    if unknown:
        raise SystemExit(f"error: unknown format(s) {unknown}; choose from {sorted(PAIRS)}")
    args.work.mkdir(parents=True, exist_ok=True)
    files = gguf_files(args.work, formats)
    prefill_ids, decode_ids = token_ids(files["q4_1"], args.prompt_tokens)
    out: dict[str, object] = {
        "threads": args.threads,
        "prompt_tokens": len(prefill_ids),
        "rounds": args.rounds,
    }
    for fmt in formats:
        job = {
            "model": str(files[fmt]),
            "threads": args.threads,
            "prefill_ids": prefill_ids,
            "decode_ids": decode_ids,
            "new_tokens": args.new_tokens,
            # what `gptlab compile` loads it as: the worker's weights (float32 for F32, the file's own else)
            "dtype": "fp32" if PAIRS[fmt] == "fp32" else "auto",
            **({"sampling": SAMPLING} if args.sampled else {}),
        }
        compile_s = None if args.compile_cache is None else round(keep_step(job, args.compile_cache), 1)
        rows: dict[str, list[dict]] = {"llama_cpp": [], "gptlab": []}
        for _ in range(args.rounds):
            rows["llama_cpp"].append(run_llama(job))
            rows["gptlab"].append(run_gptlab(job, PAIRS[fmt], args.compile, args.compile_cache))
        ours, theirs = rows["gptlab"][0].pop("generated"), rows["llama_cpp"][0].pop("generated")
        prefills = sorted({r.pop("prefill") for r in rows["gptlab"]})  # (a word, not a figure)
        agree = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        medians = {
            engine: {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0] if k != "generated"}
            for engine, runs in rows.items()
        }
        ratios = {k: round(medians["gptlab"][k] / medians["llama_cpp"][k], 2) for k in medians["gptlab"]}
        out[fmt] = {
            "gptlab_weights": PAIRS[fmt],
            **medians,
            "gptlab_over_llama_cpp": ratios,
            "greedy_tokens_agreeing": f"{agree}/{len(theirs)}",
            "gptlab_prefill": "/".join(prefills),
            **({} if compile_s is None else {"compile_s": compile_s}),
        }
    import torch

    out |= {"capability": torch.backends.cpu.get_cpu_capability(), "torch": torch.__version__}
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
