"""``gptlab prepare --workers N`` on a large corpus: wall time, MB/s, peak memory, same bytes for every N.

The corpus is Tiny Shakespeare repeated to ``--mb`` megabytes (built once in ``--dir``), tokenized
with the GPT-2 tokenizer into shards of ``--shard-tokens``. Peak memory is the largest sum of the
resident sets of the prepare process and its workers, sampled every 20 ms. Prints one JSON line.

    PYTHONPATH=src python bench/prepare_workers.py [--mb 200] [--workers 1 2]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

SHARED = Path(
    os.environ.get("GPTLAB_SHARED_DATA", Path(__file__).resolve().parents[1].parent / "shared" / "data")
)


CHILDREN_FILES = Path(f"/proc/{os.getpid()}/task/{os.getpid()}/children").exists()  # CONFIG_PROC_CHILDREN


def _tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every descendant.

    Walks ``/proc/P/task/*/children`` from ``pid`` down, reading a few small files per process
    (0.2 ms): a scan of all of ``/proc`` cost ~3 ms, every 20 ms, on a core the 2-worker run
    needs. Kernels without those files get the scan.
    """
    if not CHILDREN_FILES:
        return _tree_rss_scan(pid)
    page = os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as f:
                total += int(f.read().split()[1]) * page
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
        except OSError:  # the process (or thread) has just ended
            continue
    return total


def _tree_rss_scan(pid: int) -> int:
    """The same sum from every ``/proc/*/stat`` (parent links and resident pages)."""
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        p = int(stat.parent.name)
        children.setdefault(int(fields[1]), []).append(p)
        rss[p] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        total += rss.get(p, 0)
        todo.extend(children.get(p, []))
    return total


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _digest(directory: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(directory.glob("*.bin")):
        h.update(p.name.encode())
        with open(p, "rb") as f:
            while block := f.read(1 << 20):
                h.update(block)
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--shard-tokens", type=int, default=10_000_000)
    ap.add_argument("--dir", default="/tmp/gptlab-prepare-bench")
    args = ap.parse_args()
    root = Path(args.dir)
    root.mkdir(parents=True, exist_ok=True)
    corpus = root / f"shakespeare-{args.mb}mb.txt"
    source = (SHARED / "tinyshakespeare.txt").read_bytes()
    if not corpus.is_file():
        with open(corpus, "wb") as f:
            for _ in range(-(-args.mb * 1_000_000 // len(source))):
                f.write(source)
    size = corpus.stat().st_size
    load_before = os.getloadavg()[0]
    results = {}
    for n in args.workers:
        out = root / f"ds-w{n}"
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-m", "gptlab", "prepare", str(corpus), "--out", str(out), "--no-progress"]
        cmd += ["--tokenizer", f"gpt2:{SHARED / 'gpt2'}", "--workers", str(n)]
        cmd += ["--shard-tokens", str(args.shard_tokens)]
        t0, cpu0 = time.perf_counter(), _children_cpu()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        peak = 0
        while proc.poll() is None:
            peak = max(peak, _tree_rss(proc.pid))
            time.sleep(0.02)
        wall = time.perf_counter() - t0
        cpu = _children_cpu() - cpu0  # the prepare process and its workers (waited for)
        assert proc.returncode == 0, f"prepare failed with {proc.returncode}"
        results[n] = {
            "wall_s": round(wall, 1),
            "mb_per_s": round(size / 1e6 / wall, 2),
            "cpu_s": round(cpu, 1),
            "mb_per_cpu_s": round(size / 1e6 / cpu, 2),
            "peak_rss_mib": round(peak / 2**20),
            "digest": _digest(out),
        }
    first = args.workers[0]
    print(
        json.dumps(
            {
                "bench": "prepare_workers",
                "corpus_mb": round(size / 1e6, 1),
                "tokenizer": "gpt2",
                "cores": len(os.sched_getaffinity(0)),
                "load_avg_1m": {"before": round(load_before, 1), "after": round(os.getloadavg()[0], 1)},
                "runs": results,
                "identical": len({r["digest"] for r in results.values()}) == 1,
                "speedup": {n: round(results[first]["wall_s"] / r["wall_s"], 2) for n, r in results.items()},
            }
        )
    )


if __name__ == "__main__":
    main()
