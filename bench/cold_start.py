"""Cold start: from process start to the first generated token, as a user meets it. One JSON line.

    python bench/cold_start.py                      # smollm2 (its GGUF file, and a checkpoint converted from it)
    python bench/cold_start.py --rounds 5 --demo runs/demo

Each figure is the median of ``--rounds`` fresh processes, timed from just before the process is
spawned (warm page cache: one unmeasured run of each first):

* ``import_torch_s``: ``python -c "import torch"``, the floor every command stands on;
* ``sample_*_s``: ``gptlab sample SRC --prompt "The capital of France is" --max-new-tokens 8
  --temperature 0`` until the first generated token reaches stdout (the echoed prompt does not count),
  for the GGUF file, a converted checkpoint and, with ``--demo``, the demo model; every command keeps
  a GGUF file's conversion (and a float32 checkpoint's bf16 copy, where ``auto`` runs it in bf16) in a
  temporary ``--weights-cache`` (made by the unmeasured first run), and
  ``sample_gguf_unkept_s`` is the GGUF file converted at start (``--weights-cache none``);
* ``chat_first_token_s`` / ``chat_answer_s``: ``gptlab chat smollm2`` with one question on stdin,
  until the reply's first character, and until the reply's end;
* ``serve_ready_s`` / ``serve_first_reply_s``: ``gptlab serve smollm2`` until ``/health`` answers,
  and until the first chat completion (8 tokens) has come back;
* ``prefill_first_s`` / ``prefill_second_s``: a 505-token prefill (and one token), twice in one
  process after ``gptlab.load``; their ratio is the first-call penalty.

The commands run under ``--compile auto`` with no background compilation. By default their compile
cache is ``none``: the start of a machine that has not compiled the one-row step, decoding layer by
layer. With ``--kept-step`` each source's step is compiled first into a temporary compile cache
(``gptlab compile``, unmeasured) and every command loads it: the start of every later process.

``*_over_floor_s`` are the same figures less ``import_torch_s``; ``cpu_s`` the CPU seconds (user and
system, every thread) the measured process had used at the same moments, which a busy machine
distorts less than wall time (with ``--threads 1``: no spinning threads either). ``loadavg`` (before, after) says how
busy the machine was: on a shared machine compare figures from one run only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(
    0, str(Path(__file__).resolve().parents[1])
)  # the checkout: bench/ imports as the package `bench`
from bench.serve_load import free_port, wait_healthy  # noqa: E402

PROMPT = "The capital of France is"
QUESTION = "What is the capital of France?"
GPTLAB = [sys.executable, "-m", "gptlab"]


def _env(threads: int | None) -> dict[str, str]:
    # no command starts a background compilation (it would take the cores from the next figure)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPTLAB_BACKGROUND_COMPILE": "0"}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    return env


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system, all threads) a running process has used so far (Linux ``/proc``)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


#: CPU seconds of the last process at the moment measured (the figure a busy machine distorts least)
CPU: dict[str, float] = {}


def import_torch(env: dict[str, str]) -> float:
    start = time.perf_counter()
    before = os.times()
    subprocess.run([sys.executable, "-c", "import torch"], check=True, env=env)
    after = os.times()
    CPU["import_torch"] = (after.children_user - before.children_user) + (
        after.children_system - before.children_system
    )
    return time.perf_counter() - start


def until_output(
    cmd: list[str], env: dict[str, str], after: int, stdin: str | None = None
) -> tuple[float, float]:
    """Seconds from spawning ``cmd`` until its stdout holds more than ``after`` bytes, and until it exits."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert proc.stdin is not None and proc.stdout is not None
    if stdin is not None:
        proc.stdin.write(stdin.encode())
    proc.stdin.close()
    seen, first = b"", None
    while chunk := os.read(proc.stdout.fileno(), 4096):
        seen += chunk
        if first is None and len(seen.rstrip(b"\n")) > after:
            first = time.perf_counter() - start
            CPU["first"] = cpu_seconds(proc.pid)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    if proc.wait() != 0 or first is None:
        raise RuntimeError(f"{' '.join(cmd)} failed: {stderr[-2000:]}")
    return first, time.perf_counter() - start


#: ``--weights-cache`` of every command (``main`` sets a temporary folder: a GGUF file's kept conversion)
STORE = ["--weights-cache", "none"]
#: ``--compile-cache`` of every command (``main`` sets a temporary folder with ``--kept-step``)
COMPILED = ["--compile-cache", "none"]


def sample(src: str, env: dict[str, str], store: list[str] | None = None) -> float:
    cmd = [*GPTLAB, "sample", src, "--prompt", PROMPT, "--max-new-tokens", "8", "--temperature", "0"]
    return until_output([*cmd, *(store or STORE), *COMPILED], env, after=len(PROMPT.encode()))[0]


def chat(src: str, env: dict[str, str]) -> tuple[float, float]:
    cmd = [*GPTLAB, "chat", src, "--max-new-tokens", "16", *STORE, *COMPILED]
    return until_output(cmd, env, 0, f"{QUESTION}\n/exit\n")


def serve(src: str, env: dict[str, str]) -> tuple[float, float]:
    """Seconds until ``/health`` answers, and until the first chat completion has come back."""
    import httpx

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    start = time.perf_counter()
    cmd = [*GPTLAB, "serve", src, "--port", str(port), "--max-batch", "1", *STORE, *COMPILED]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        wait_healthy(url, proc, timeout=600)
        ready = time.perf_counter() - start
        CPU["ready"] = cpu_seconds(proc.pid)
        body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 8, "temperature": 0}
        reply = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=600)
        reply.raise_for_status()
        CPU["first"] = cpu_seconds(proc.pid)
        return ready, time.perf_counter() - start
    finally:
        proc.terminate()
        proc.wait(timeout=30)


PREFILL = """
import json, sys, time, torch, gptlab
model, tok = gptlab.load(sys.argv[1], quantize=sys.argv[2])
ids = torch.randint(0, model.config.vocab_size, (1, 505), generator=torch.Generator().manual_seed(0))
times = []
for _ in range(2):
    start = time.perf_counter()
    gptlab.generate_ids(model, ids, 1, temperature=0)
    times.append(time.perf_counter() - start)
print(json.dumps(times))
"""


def prefill(src: str, weights: str, env: dict[str, str]) -> list[float]:
    out = subprocess.run(
        [sys.executable, "-c", PREFILL, src, weights], check=True, env=env, capture_output=True, text=True
    )
    return list(json.loads(out.stdout.strip().splitlines()[-1]))


def auto_weights() -> str:
    from gptlab.hardware import inference_weights

    return inference_weights("cpu", 1)


def median(values: list[float]) -> float:
    return round(statistics.median(values), 3)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3, help="fresh processes per figure (median; default 3)")
    p.add_argument("--source", default="smollm2", help="the GGUF source (default smollm2)")
    p.add_argument("--checkpoint", help="a checkpoint of it (default: converted into a temporary folder)")
    p.add_argument("--demo", help="the demo model's run directory or checkpoint, if one is at hand")
    p.add_argument("--threads", type=int, help="OMP_NUM_THREADS for every process (default: torch's choice)")
    p.add_argument("--skip", default="", help="comma-separated parts to leave out: chat, serve, prefill")
    p.add_argument(
        "--kept-step",
        action="store_true",
        help="compile each source's one-row step first (gptlab compile) and load it in every command",
    )
    args = p.parse_args(argv)
    env = _env(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    load_before = os.getloadavg()
    kept: dict[str, object] = {}  # each source's step kept (True), or why not
    with tempfile.TemporaryDirectory() as tmp:
        STORE[1] = str(Path(tmp) / "weights")  # kept conversions: made by the unmeasured first runs
        ckpt = args.checkpoint
        if ckpt is None:
            ckpt = str(Path(tmp) / "ckpt")
            subprocess.run(
                [*GPTLAB, "convert", "--from", args.source, "--out", ckpt],
                check=True,
                env=env,
                stdout=subprocess.DEVNULL,
            )
        sources = {"gguf": args.source, "checkpoint": ckpt, **({"demo": args.demo} if args.demo else {})}
        if args.kept_step:
            COMPILED[1] = str(Path(tmp) / "compiled")
            for name, src in (("gguf", args.source), ("checkpoint", ckpt)):  # what the commands load
                cmd = [*GPTLAB, "compile", src, "--compile-cache", COMPILED[1], *STORE]
                done = subprocess.run(cmd, env=env, capture_output=True, text=True)
                # (a step that cannot be kept, e.g. bf16 through oneDNN's prepacked copies, runs layer by layer)
                kept[name] = done.returncode == 0 or done.stderr.strip().splitlines()[-1:]
        for src in sources.values():  # warm the page cache (and inductor's), unmeasured
            sample(src, env)
        runs: dict[str, list[float]] = {}
        cpu: dict[str, list[float]] = {}  # CPU seconds of the measured process at the same moments
        for _ in range(args.rounds):  # in turns, so a busy moment falls on every figure alike
            runs.setdefault("import_torch_s", []).append(import_torch(env))
            cpu.setdefault("import_torch", []).append(CPU["import_torch"])
            for name, src in sources.items():
                runs.setdefault(f"sample_{name}_s", []).append(sample(src, env))
                cpu.setdefault(f"sample_{name}", []).append(CPU["first"])
            # the same file converted at start (no kept conversion): a first start, less writing the entry
            runs.setdefault("sample_gguf_unkept_s", []).append(
                sample(args.source, env, ["--weights-cache", "none"])
            )
            cpu.setdefault("sample_gguf_unkept", []).append(CPU["first"])
            if "chat" not in skip:
                first, answer = chat(args.source, env)
                runs.setdefault("chat_first_token_s", []).append(first)
                runs.setdefault("chat_answer_s", []).append(answer)
                cpu.setdefault("chat_first_token", []).append(CPU["first"])
            if "serve" not in skip:
                ready, reply = serve(args.source, env)
                runs.setdefault("serve_ready_s", []).append(ready)
                runs.setdefault("serve_first_reply_s", []).append(reply)
                cpu.setdefault("serve_ready", []).append(CPU["ready"])
                cpu.setdefault("serve_first_reply", []).append(CPU["first"])
            if "prefill" not in skip:
                first_fill, second_fill = prefill(args.source, auto_weights(), env)
                runs.setdefault("prefill_first_s", []).append(first_fill)
                runs.setdefault("prefill_second_s", []).append(second_fill)
    result: dict[str, Any] = {
        "bench": "cold_start",
        "rounds": args.rounds,
        "weights": auto_weights(),
        "kept_step": kept if args.kept_step else False,
    }
    result.update({name: median(values) for name, values in runs.items()})
    floor = result["import_torch_s"]
    for name in list(result):
        if name.endswith("_s") and name != "import_torch_s" and not name.startswith("prefill"):
            result[name.removesuffix("_s") + "_over_floor_s"] = round(result[name] - floor, 3)
    if "prefill_first_s" in result:
        result["prefill_first_over_second"] = round(result["prefill_first_s"] / result["prefill_second_s"], 2)
    result["cpu_s"] = {name: median(values) for name, values in cpu.items()}
    result["ranges"] = {name: [round(min(v), 3), round(max(v), 3)] for name, v in runs.items()}
    result["loadavg"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
    result["cpu"] = _cpu()
    print(json.dumps(result))
    return result


def _cpu() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} CPUs)"
    except OSError:
        pass
    return f"{os.cpu_count()} CPUs"


if __name__ == "__main__":
    main()
