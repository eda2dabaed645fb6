"""SmolLM2-135M-Instruct's Q4_1 GGUF file in int4 (its blocks kept), int8 and bf16, and (if installed)
real llama.cpp on the same file: prefill, steady decode and memory. Prints one JSON line.

    python bench/int4_decode.py                             # int4, int8, bf16 (+ llama.cpp), one round
    python bench/int4_decode.py --formats int4 --rounds 2 --new-tokens 32 --threads 1
    python bench/int4_decode.py --perplexity               # only the perplexities (2,048 held-out tokens)

Each engine and round runs in a fresh process (alternating: llama.cpp, then each gptlab format), so
peak memory is the process's own. gptlab loads the file with ``gptlab.load`` (int4: as it ships, the
Q4_1 blocks as int4 and the Q8_0 token table as int8), or ``from_gguf(quantize="int8" | "bf16")``.
Per process:
    load_s        process spawn → model ready (interpreter, imports, reading the file)
    prefill_s     a ``--prompt-tokens`` prompt (Tiny Shakespeare) to its first token: first and second call
    decode_tps    steady greedy decode after a 6-token prompt, tokens per second (wall), median of 3
    decode_cpu_tps  the same per CPU second of the process (steadier on a busy machine); for llama.cpp
                  from two processes decoding ``--new-tokens`` and 8 tokens: the difference of their CPU times
    rss_mb        resident memory after decoding; max_rss_mb the process's peak
llama.cpp is npm's ``node-llama-cpp`` (``make llama-cpp``: ``.cache/llama-cpp``, or ``--llama-cpp DIR``),
timed by its ``bench.mjs`` the same way. Medians over the rounds.
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
PROMPT = "The capital of France is"


def gguf_file() -> Path:
    sys.path.insert(0, str(ROOT / "src"))
    from gptlab.interop.gguf import resolve

    return resolve("smollm2")


def token_ids(prompt_tokens: int) -> tuple[list[int], list[int]]:
    """A ``prompt_tokens`` prefill from Tiny Shakespeare and the 6-token decode prompt, as the file tokenizes."""
    sys.path.insert(0, str(ROOT / "src"))
    from gptlab.interop.gguf import tokenizer_from_gguf

    tok = tokenizer_from_gguf(gguf_file())
    text = (ROOT.parent / "shared" / "data" / "tinyshakespeare.txt").read_text()[:20000]
    return tok.encode(text)[:prompt_tokens], tok.encode(PROMPT)


def run_gptlab(job: dict, weights: str, compile_mode: str) -> dict:
    started = time.time()
    cmd = [sys.executable, __file__, "--worker", json.dumps(job), "--weights", weights]
    cmd += ["--compile", compile_mode]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "OMP_NUM_THREADS": str(job["threads"])}
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    out = json.loads(done.stdout.strip().splitlines()[-1])
    out["load_s"] = out.pop("loaded_at") - started
    return out


def child_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_llama_cpp(job: dict, llama_dir: Path) -> dict:
    short = run_llama_cpp_once({**job, "new_tokens": 8}, llama_dir)
    out = run_llama_cpp_once(job, llama_dir)
    out["decode_cpu_tps"] = (job["new_tokens"] - 8) / max(out.pop("cpu_s") - short["cpu_s"], 1e-9)
    return out


def run_llama_cpp_once(job: dict, llama_dir: Path) -> dict:
    started, cpu = time.time(), child_cpu()
    request = {"model": job["model"], "threads": job["threads"], "prefill_ids": job["prefill_ids"]}
    request |= {"decode_ids": job["decode_ids"], "new_tokens": job["new_tokens"]}
    done = subprocess.run(
        ["node", str(llama_dir / "bench.mjs")],
        input=json.dumps(request),
        capture_output=True,
        text=True,
        check=True,
        cwd=llama_dir,
    )
    out = json.loads(done.stdout)
    return {
        "load_s": out["loaded_at_ms"] / 1000 - started,
        "prefill_first_s": out["prefill_s"][0],
        "prefill_second_s": out["prefill_s"][1],
        "decode_tps": out["decode_tokens_per_s"],
        "rss_mb": out["rss_mb"],
        "max_rss_mb": out["max_rss_mb"],
        "generated": out["generated"],
        "cpu_s": child_cpu() - cpu,
    }


def worker(job: dict, weights: str, compile_mode: str) -> None:
    """One gptlab process: load the file in ``weights``, then the same measurements as ``bench.mjs``."""
    import torch

    import gptlab
    from gptlab.generate import generate_ids, prepare_decoding
    from gptlab.interop.gguf import from_gguf

    torch.set_num_threads(job["threads"])
    if weights == "int4":
        model, _ = gptlab.load(job["model"])  # as the file ships: Q4_1 → int4, Q8_0 → int8
    else:
        model = from_gguf(job["model"], quantize=weights)
    prepare_decoding(model, compile=compile_mode)
    loaded_at = time.time()
    generated: list[int] = []

    def timed(ids: list[int], n: int) -> tuple[float, float]:
        t, c = time.perf_counter(), time.process_time()
        out = generate_ids(model, torch.tensor([ids]), n, temperature=0.0)
        wall, cpu = time.perf_counter() - t, time.process_time() - c
        generated[:] = out[0, len(ids) :].tolist()
        return wall, cpu

    prefill = [timed(job["prefill_ids"], 1)[0] for _ in range(2)]
    n = job["new_tokens"]
    timed(job["decode_ids"], n)  # warm-up (a compiled step compiles here)
    tokens = list(generated)
    rates, cpu_rates = [], []
    for _ in range(3):
        (w_all, c_all), (w_one, c_one) = timed(job["decode_ids"], n), timed(job["decode_ids"], 1)
        rates.append((n - 1) / (w_all - w_one))
        cpu_rates.append((n - 1) / max(c_all - c_one, 1e-9))
    rss = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    out = {
        "loaded_at": loaded_at,
        "weights": getattr(model, "quantization", weights),
        "prefill_first_s": prefill[0],
        "prefill_second_s": prefill[1],
        "decode_tps": statistics.median(rates),
        "decode_cpu_tps": statistics.median(cpu_rates),
        "rss_mb": rss,
        "max_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "generated": tokens,
    }
    print(json.dumps(out))


def perplexities(tokens: int = 2048, window: int = 512) -> dict:
    """Perplexity on the held-out end of Tiny Shakespeare: the file dequantised (float32), the same with
    only its token table requantised per row (what Q8_0 → int8 costs), kept (int4), and int8."""
    import math

    import torch

    from gptlab.interop.gguf import from_gguf, tokenizer_from_gguf
    from gptlab.model.quantized import quantize_rows

    text = (ROOT.parent / "shared" / "data" / "tinyshakespeare.txt").read_text()[-12000:]
    ids = torch.tensor(tokenizer_from_gguf(gguf_file()).encode(text)[: tokens + 1])

    def ppl(model: torch.nn.Module) -> float:
        total, count = 0.0, 0
        with torch.no_grad():
            for i in range(0, ids.numel() - 1, window):
                y = ids[i + 1 : i + window + 1]
                loss = model(ids[i : i + y.numel()][None], y[None])[1]
                total, count = total + float(loss) * y.numel(), count + y.numel()
        return round(math.exp(total / count), 4)

    dense = from_gguf(gguf_file())
    out = {"tokens": ids.numel() - 1, "dequantised_fp32": ppl(dense)}
    with torch.no_grad():
        q, s = quantize_rows(dense.wte.weight)
        dense.wte.weight.copy_(q.float() * s)
    out["fp32_table_requantised_per_row"] = ppl(dense)
    del dense
    out["kept_int4"] = ppl(from_gguf(gguf_file(), quantize="keep"))
    out["int8"] = ppl(from_gguf(gguf_file(), quantize="int8"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--formats", default="int4,int8,bf16", help="gptlab weight formats (%(default)s)")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--prompt-tokens", type=int, default=505)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--compile", default="off", help="gptlab's --compile (off, on, auto)")
    p.add_argument("--llama-cpp", type=Path, default=ROOT / ".cache" / "llama-cpp", help="node-llama-cpp dir")
    p.add_argument("--perplexity", action="store_true", help="only the perplexities, in this process")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--weights", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(json.loads(args.worker), args.weights, args.compile)
        return 0
    if args.perplexity:
        print(json.dumps(perplexities()))
        return 0
    formats = [f.strip() for f in args.formats.split(",") if f.strip()]
    prefill_ids, decode_ids = token_ids(args.prompt_tokens)
    job = {"model": str(gguf_file()), "threads": args.threads, "new_tokens": args.new_tokens}
    job |= {"prefill_ids": prefill_ids, "decode_ids": decode_ids}
    llama = (args.llama_cpp / "bench.mjs").exists() and shutil.which("node") is not None
    runs: dict[str, list[dict]] = {f: [] for f in formats} | ({"llama.cpp Q4_1": []} if llama else {})
    for _ in range(args.rounds):
        if llama:
            runs["llama.cpp Q4_1"].append(run_llama_cpp(job, args.llama_cpp))
        for fmt in formats:
            runs[fmt].append(run_gptlab(job, fmt, args.compile))
    keys = (
        "load_s",
        "prefill_first_s",
        "prefill_second_s",
        "decode_tps",
        "decode_cpu_tps",
        "rss_mb",
        "max_rss_mb",
    )
    result: dict = {"threads": args.threads, "prompt_tokens": len(prefill_ids), "new_tokens": args.new_tokens}
    result["compile"] = args.compile
    for name, rs in runs.items():
        result[name] = {k: round(statistics.median(r[k] for r in rs), 3) for k in keys if k in rs[0]}
        if "weights" in rs[0]:
            result[name]["weights"] = rs[0]["weights"]
    if llama:
        ref = runs["llama.cpp Q4_1"][0]["generated"]
        base = result["llama.cpp Q4_1"]
        for fmt in formats:
            got = runs[fmt][0]["generated"]
            agree = next((i for i, (a, b) in enumerate(zip(got, ref, strict=False)) if a != b), len(got))
            result[fmt]["greedy_tokens_agreeing_with_llama_cpp"] = agree
            result[fmt]["decode_vs_llama_cpp"] = round(result[fmt]["decode_tps"] / base["decode_tps"], 2)
            result[fmt]["decode_cpu_vs_llama_cpp"] = round(
                result[fmt]["decode_cpu_tps"] / base["decode_cpu_tps"], 2
            )
            result[fmt]["max_rss_vs_llama_cpp"] = round(result[fmt]["max_rss_mb"] / base["max_rss_mb"], 2)
            result[fmt]["prefill_vs_llama_cpp"] = round(
                base["prefill_second_s"] / result[fmt]["prefill_second_s"], 2
            )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
