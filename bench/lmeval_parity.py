"""Compare two lm-eval runs item by item (``--log_samples --output_path``): loglikelihoods, rolling
loglikelihoods, generations and the aggregate figures. Prints one JSON line.

    python bench/lmeval_parity.py OUT_A OUT_B

Each OUT is an ``--output_path`` folder (searched for ``results_*.json`` and ``samples_<task>_*.jsonl``;
the newest of each). The line holds, per task: the largest per-item difference of the log-likelihoods,
whether every greedy flag and every generation is identical, and each metric of both runs with its
relative difference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def newest(folder: Path, pattern: str) -> Path:
    found = sorted(folder.rglob(pattern), key=lambda p: p.stat().st_mtime)
    if not found:
        sys.exit(f"error: no {pattern} under {folder}")
    return found[-1]


def samples(folder: Path, task: str) -> list[dict]:
    with newest(folder, f"samples_{task}_*.jsonl").open(encoding="utf-8") as f:
        return sorted((json.loads(line) for line in f), key=lambda s: s["doc_id"])


def responses(sample: dict) -> list:
    return [r[0] for r in sample["resps"]]


def number(value: object) -> float | None:
    """A saved log-likelihood (``--log_samples`` writes them as strings), or None for a generation."""
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None


def compare_task(a: list[dict], b: list[dict]) -> dict:
    worst, greedy_same, texts_same = 0.0, True, True
    for sa, sb in zip(a, b, strict=True):
        for ra, rb in zip(responses(sa), responses(sb), strict=True):
            if isinstance(ra, list):  # (loglikelihood, greedy)
                worst = max(worst, abs(float(ra[0]) - float(rb[0])))
                greedy_same &= str(ra[1]) == str(rb[1])
            elif number(ra) is not None and number(rb) is not None:  # a rolling loglikelihood
                worst = max(worst, abs(number(ra) - number(rb)))
            else:  # a generation
                texts_same &= ra == rb
    return {"items": len(a), "max_abs_diff": worst, "greedy_same": greedy_same, "texts_same": texts_same}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    args = p.parse_args()
    ra = json.loads(newest(args.a, "results_*.json").read_text())["results"]
    rb = json.loads(newest(args.b, "results_*.json").read_text())["results"]
    out = {}
    for task in sorted(ra):
        row = compare_task(samples(args.a, task), samples(args.b, task))
        for metric, value in ra[task].items():
            if "stderr" in metric or not isinstance(value, int | float) or metric not in rb[task]:
                continue
            other = rb[task][metric]
            row[metric] = {"a": value, "b": other, "rel_diff": abs(other - value) / max(abs(value), 1e-12)}
        out[task] = row
    print(json.dumps(out))


if __name__ == "__main__":
    main()
