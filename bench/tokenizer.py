"""Tokenizer benchmark on Tiny Shakespeare; prints one JSON line.

    .venv/bin/python bench/tokenizer.py [--repeat 5] [--data ../shared/data]
    .venv/bin/python bench/tokenizer.py --pretrained smollm2   # a GGUF file's vocabulary instead

Figures (medians over ``--repeat`` runs):
- ``train_s``: BPETokenizer.train to vocab 4096 (gpt4 pattern, <|endoftext|>), split included
  (``train_cpu_s``: the same in CPU seconds of this process, which a busy machine does not inflate);
- ``encode_mb_s`` / ``tiktoken_encode_mb_s`` / ``encode_ratio``: GPT-2 encoding of the whole
  corpus by ours (default back-end) and by tiktoken's own gpt2 encoding;
- ``encode_python_mb_s``: ours with the pure-Python back-end, warm chunk cache;
- ``decode_mb_s`` / ``decode_python_mb_s``: GPT-2 decoding of the corpus's ids;
- ``char_encode_mb_s`` / ``char_decode_mb_s``: CharTokenizer on the corpus;
- ``hf_train_s``: Hugging Face ``tokenizers`` byte-level BPE to vocab 4096, if installed.

With ``--pretrained FILE`` (a GGUF file, or ``smollm2``): ``header_s``, parsing the file's header (its
vocabulary's strings); ``build_s``, the ``PretrainedTokenizer`` from them; ``held_mb``, the Python memory
the tokenizer holds once the parsed header is dropped (``tracemalloc``), and ``peak_mb`` while it is
built; the corpus's ids by both back-ends are checked equal.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import sys
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from gptlab.tokenizers import EOT, BPETokenizer, CharTokenizer, GPT2Tokenizer  # noqa: E402


def median_seconds(fn, repeat: int, clock=time.perf_counter) -> float:
    times = []
    for _ in range(repeat):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def tiktoken_gpt2(data: Path):
    """tiktoken's gpt2 encoding, built by tiktoken's loader from the local files (no network)."""
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tiktoken_ext.openai_public import r50k_pat_str

    os.environ["TIKTOKEN_CACHE_DIR"] = ""
    ranks = data_gym_to_mergeable_bpe_ranks(
        str(data / "gpt2" / "vocab.bpe"), str(data / "gpt2" / "encoder.json")
    )
    return tiktoken.Encoding("gpt2", pat_str=r50k_pat_str, mergeable_ranks=ranks, special_tokens={EOT: 50256})


def hf_train_seconds(path: Path, repeat: int) -> float | None:
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError:
        return None

    def train() -> None:
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(
            vocab_size=4096,
            special_tokens=[EOT],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
        tok.train([str(path)], trainer)

    return median_seconds(train, repeat)


def pretrained(source: str, text: str, repeat: int) -> dict[str, object]:
    """A GGUF file's vocabulary: header parse and tokenizer build times, the memory the tokenizer holds."""
    from gptlab.interop.gguf import resolve
    from gptlab.interop.gguf_file import parse_gguf
    from gptlab.tokenizers import PretrainedTokenizer

    path = resolve(source)
    header_s = median_seconds(lambda: parse_gguf(path), repeat)
    build = functools.partial(PretrainedTokenizer.from_gguf_fields, parse_gguf(path)[0])
    build_s = median_seconds(build, repeat)
    del build  # (and the parsed header with it)
    gc.collect()
    tracemalloc.start()
    fields = parse_gguf(path)[0]
    tok = PretrainedTokenizer.from_gguf_fields(fields)
    del fields
    gc.collect()
    held, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert tok.encode(text) == tok.with_backend("python").encode(text), "the back-ends' ids differ"
    return {
        "bench": "tokenizer-pretrained",
        "source": path.name,
        "tokens": len(tok.tokens),
        "merges": len(tok.merges),
        "repeat": repeat,
        "header_s": round(header_s, 4),
        "build_s": round(build_s, 4),
        "held_mb": round(held / 2**20, 2),
        "peak_mb": round(peak / 2**20, 2),
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--pretrained", metavar="FILE", help="a GGUF file's vocabulary (or smollm2) instead")
    args = parser.parse_args()
    corpus = args.data / "tinyshakespeare.txt"
    text = corpus.read_text(encoding="utf-8")
    mb = len(text.encode("utf-8")) / 1e6
    if args.pretrained:
        print(json.dumps(pretrained(args.pretrained, text, args.repeat)))
        return

    train_s = median_seconds(lambda: BPETokenizer.train(text, 4096), args.repeat)
    # CPU time of this process: what the wall time would be on an idle machine
    train_cpu_s = median_seconds(lambda: BPETokenizer.train(text, 4096), args.repeat, clock=time.process_time)

    ours = GPT2Tokenizer.from_dir(args.data / "gpt2")
    python = ours.with_backend("python")
    reference = tiktoken_gpt2(args.data)
    ids = ours.encode(text)
    assert ids == reference.encode_ordinary(text) == python.encode(text), "ids differ from tiktoken"

    # interleaved, so that load from other processes hits both sides alike
    enc_times, ref_times = [], []
    for _ in range(args.repeat):
        enc_times.append(median_seconds(lambda: ours.encode(text), 1))
        ref_times.append(median_seconds(lambda: reference.encode(text), 1))
    enc_s, ref_s = statistics.median(enc_times), statistics.median(ref_times)
    py_s = median_seconds(lambda: python.encode(text), args.repeat)
    dec_s = median_seconds(lambda: ours.decode(ids), args.repeat)
    dec_py_s = median_seconds(lambda: python.decode(ids), args.repeat)
    hf_s = hf_train_seconds(corpus, args.repeat)

    chars = CharTokenizer.from_text(text)
    char_ids = chars.encode(text)
    char_enc_s = median_seconds(lambda: chars.encode(text), args.repeat)
    char_dec_s = median_seconds(lambda: chars.decode(char_ids), args.repeat)

    result = {
        "bench": "tokenizer",
        "corpus_mb": round(mb, 3),
        "repeat": args.repeat,
        "train_s": round(train_s, 3),
        "train_cpu_s": round(train_cpu_s, 3),
        "hf_train_s": None if hf_s is None else round(hf_s, 3),
        "encode_backend": ours.backend,
        "encode_mb_s": round(mb / enc_s, 2),
        "tiktoken_encode_mb_s": round(mb / ref_s, 2),
        "encode_ratio": round(ref_s / enc_s, 3),
        "encode_python_mb_s": round(mb / py_s, 2),
        "decode_mb_s": round(mb / dec_s, 1),
        "decode_python_mb_s": round(mb / dec_py_s, 1),
        "char_encode_mb_s": round(mb / char_enc_s, 1),
        "char_decode_mb_s": round(mb / char_dec_s, 1),
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
