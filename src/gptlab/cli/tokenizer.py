"""``gptlab tokenizer {train,encode,decode,show}``: argument parsing only.

gptlab tokenizer train input.txt --vocab-size 4096 --out tok.json
echo "Hello world" | gptlab tokenizer encode --tokenizer ../shared/data/gpt2
echo "15496 995" | gptlab tokenizer decode --tokenizer ../shared/data/gpt2
echo "Hello world" | gptlab tokenizer encode --tokenizer smollm2   # a model's own tokenizer
gptlab tokenizer show --tokenizer tok.json --limit 300
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import TYPE_CHECKING

from gptlab.errors import GptlabError
from gptlab.tokenizers import EOT, PATTERNS, BPETokenizer, CharTokenizer, load
from gptlab.tokenizers.loading import parse_ids, read_corpus
from gptlab.tokenizers.render import vocab_lines

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

TOKENIZER_HELP = (
    "a tokenizer JSON file (from 'train'), a GPT-2 folder (vocab.bpe + encoder.json), a .tiktoken file, "
    "or a model whose tokenizer to use (a checkpoint or run, a Hugging Face folder, a GGUF file, smollm2)"
)


def _tokenizer(spec: str) -> Tokenizer:
    """``--tokenizer``: a saved tokenizer or the tokenizer a model carries, as ``gptlab prepare
    --tokenizer`` reads them (``gptlab.data.prepare.saved_tokenizer``)."""
    from gptlab.cli.prepare import model_tokenizer
    from gptlab.data.prepare import saved_tokenizer

    tok = saved_tokenizer(spec, model_tokenizer)
    return tok if tok is not None else load(spec)  # the error naming the missing file


def _read_stdin_text() -> str:
    data = sys.stdin.buffer.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GptlabError(f"standard input is not UTF-8 text (invalid byte at offset {exc.start})") from None


def _train(args: argparse.Namespace) -> int:
    specials = [] if args.no_special else (args.special or [EOT])
    started = time.perf_counter()
    if args.kind == "char":
        text = "".join(read_corpus(args.files))
        tok: Tokenizer = CharTokenizer.from_text(text, unk=args.unk, special_tokens=specials)
    else:
        if args.vocab_size is None:
            raise GptlabError("--vocab-size is required for a BPE tokenizer (e.g. --vocab-size 4096)")
        tok = BPETokenizer.train(
            read_corpus(args.files),
            args.vocab_size,
            pattern=args.pattern,
            special_tokens=specials,
            progress=not args.quiet,
        )
    tok.save(args.out)
    seconds = time.perf_counter() - started
    print(
        f"wrote {args.out}: {tok.kind} tokenizer, vocab_size {tok.vocab_size}, {seconds:.2f} s",
        file=sys.stderr,
    )
    return 0


def _encode(args: argparse.Namespace) -> int:
    tok = _tokenizer(args.tokenizer)
    text = args.text if args.text is not None else _read_stdin_text()
    ids = tok.encode(text, allowed_special="all" if args.allow_special else frozenset())
    sys.stdout.write(" ".join(map(str, ids)) + "\n")
    return 0


def _decode(args: argparse.Namespace) -> int:
    tok = _tokenizer(args.tokenizer)
    ids = parse_ids(" ".join(args.ids) if args.ids else _read_stdin_text())
    sys.stdout.write(tok.decode(ids))
    if sys.stdout.isatty():
        sys.stdout.write("\n")
    return 0


def _show(args: argparse.Namespace) -> int:
    tok = _tokenizer(args.tokenizer)
    print(f"# {tok.kind} tokenizer, vocab_size {tok.vocab_size}, special tokens {tok.special_tokens}")
    for line in vocab_lines(tok, start=args.start, limit=args.limit):
        print(line)
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("tokenizer", help="train, apply and inspect tokenizers")
    sub = parser.add_subparsers(dest="tokenizer_command", metavar="SUBCOMMAND", required=True)

    train = sub.add_parser("train", help="train a tokenizer on text files and save it as JSON")
    train.add_argument("files", nargs="+", metavar="FILE", help="UTF-8 text files (each is one document)")
    train.add_argument("--kind", choices=["bpe", "char"], default="bpe", help="tokenizer kind (default: bpe)")
    train.add_argument("--vocab-size", type=int, help="BPE vocabulary size, special tokens included")
    train.add_argument(
        "--pattern",
        default="gpt4",
        help=f"split regex for BPE: one of {sorted(PATTERNS)} or a custom regex (default: gpt4)",
    )
    train.add_argument(
        "--special", action="append", metavar="TOKEN", help=f"a special token (repeatable; default: {EOT})"
    )
    train.add_argument("--no-special", action="store_true", help="no special tokens at all")
    train.add_argument("--unk", help="char tokenizer: the token that stands for unseen characters")
    train.add_argument("--out", required=True, help="where to write the tokenizer JSON")
    train.add_argument("--quiet", action="store_true", help="no progress bar")
    train.set_defaults(func=_train)

    encode = sub.add_parser("encode", help="text (stdin or --text) -> token ids on stdout")
    encode.add_argument("--tokenizer", required=True, help=TOKENIZER_HELP)
    encode.add_argument("--text", help="the text to encode (default: read stdin)")
    encode.add_argument(
        "--allow-special",
        action="store_true",
        help="match special tokens such as <|endoftext|> (default: plain text)",
    )
    encode.set_defaults(func=_encode)

    decode = sub.add_parser("decode", help="token ids (arguments or stdin) -> text on stdout")
    decode.add_argument("--tokenizer", required=True, help=TOKENIZER_HELP)
    decode.add_argument(
        "ids", nargs="*", help="token ids (default: read stdin; spaces, commas or a JSON list)"
    )
    decode.set_defaults(func=_decode)

    show = sub.add_parser("show", help="list the vocabulary: id and token, control characters escaped")
    show.add_argument("--tokenizer", required=True, help=TOKENIZER_HELP)
    show.add_argument("--start", type=int, default=0, help="first id to show")
    show.add_argument("--limit", type=int, help="how many ids to show (default: all)")
    show.set_defaults(func=_show)
