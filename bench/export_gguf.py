"""Time ``to_gguf`` on a model source and print one JSON line: load time, export time and file size per type.

    python bench/export_gguf.py smollm2 --types f32 q8_0 --out /tmp/gguf-bench

``load_s`` is opening the source (for ``smollm2``: reading and dequantizing its Q4_1 file);
``export_s`` is ``to_gguf`` alone (tensor conversion, quantization, writing, fsync).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from gptlab.interop.gguf_export import TYPES, to_gguf
from gptlab.sources import load_source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "source", help="any model source (run dir, checkpoint, HF folder, GGUF file, smollm2)"
    )
    parser.add_argument("--types", nargs="+", default=["f32", "q8_0"], choices=list(TYPES))
    parser.add_argument("--out", default="/tmp/gguf-bench", help="folder for the files")
    args = parser.parse_args()
    started = time.perf_counter()
    model, tokenizer = load_source(args.source)
    result: dict[str, object] = {"source": args.source, "load_s": round(time.perf_counter() - started, 2)}
    for kind in args.types:
        path = Path(args.out) / kind / "model.gguf"
        started = time.perf_counter()
        to_gguf(model, path, tokenizer, type=kind)
        result[f"export_{kind}_s"] = round(time.perf_counter() - started, 2)
        result[f"size_{kind}_mib"] = round(path.stat().st_size / 2**20, 1)
    if "f32" in args.types:
        for kind in args.types:
            result[f"ratio_{kind}"] = round(result[f"size_{kind}_mib"] / result["size_f32_mib"], 3)  # type: ignore[operator]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
