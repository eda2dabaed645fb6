"""Instruction and chat data → rows of tokens with a loss mask and example boundaries.

Formats (``gptlab prepare --format``):

* ``chat``: JSONL of ``{"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}``
  (OpenAI's format; multi-turn; system messages optional);
* ``alpaca``: JSONL or a JSON array of ``{"instruction", "input", "output"}``, read as one user
  turn (instruction, then the input after a blank line) and one assistant turn.

Each example is rendered with the model's chat template or a named one, and tokenized
piece by piece so that every token knows whether it belongs to an assistant turn. The
loss counts only those (every assistant turn of a conversation), unless ``prompt_loss``:

    L = −Σ_t m_t·log P(x_t | x_<t) / Σ_t m_t,     m_t = 1 iff token t is an assistant token

Examples go whole into rows of ``T + 1`` tokens (``block_size + 1``): several per row
(``packed``, each token remembering its position in its example so that attention stays
inside the example) or one per row (``padded``). An example longer than a row is
truncated or dropped (``too_long``), and the counts go to ``meta.json``. Files beside the
tokens: ``<split>.mask.bin`` (uint8) and, packed, ``<split>.pos.bin``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from gptlab.data.dataset import DATASET_FORMAT, META_FILE, TOKENIZER_FILE, new_dataset_dir, staged_directory
from gptlab.data.sources import PathLike, describe_sources, find_sources
from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

ROLES = ("system", "user", "assistant")
PACKING = ("packed", "padded")
TOO_LONG = ("truncate", "drop")

Messages = list[dict[str, str]]


class BadRecord(Exception):
    """A record that is not a usable example; the message says why."""


# ------------------------------------------------------------------ records
def check_turns(messages: Any) -> Messages:
    """A record's ``"messages"``: a non-empty list of ``{"role", "content"}`` turns with known roles,
    string contents and no empty assistant turn → the turns, other keys dropped (``BadRecord`` says
    which turn is wrong)."""
    if not isinstance(messages, list) or not messages:
        raise BadRecord('"messages" must be a non-empty list')
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise BadRecord(f'message {i} needs "role" and "content"')
        if m["role"] not in ROLES:
            raise BadRecord(f"message {i} has role {m['role']!r}; roles are {', '.join(ROLES)}")
        if not isinstance(m["content"], str):
            raise BadRecord(f"message {i} content must be a string, got {type(m['content']).__name__}")
        if m["role"] == "assistant" and not m["content"].strip():
            raise BadRecord(f"message {i} is an empty assistant turn")
    return [{"role": m["role"], "content": m["content"]} for m in messages]


def _check_messages(messages: Any) -> Messages:
    turns = check_turns(messages)
    if not any(m["role"] == "assistant" for m in turns):
        raise BadRecord("no assistant turn to learn from")
    return turns


def prompt_turns(record: Any) -> Messages:
    """What a prompt record asks (preference pairs, RL prompts): either ``"prompt"``, a non-empty string
    (one user turn), or ``"messages"``, a chat that ends on a user turn (the model writes the next one)."""
    if not isinstance(record, dict) or ("prompt" in record) == ("messages" in record):
        raise BadRecord('a prompt record has either "prompt" (a string) or "messages" (a chat), not both')
    if "prompt" in record:
        if not isinstance(record["prompt"], str) or not record["prompt"].strip():
            raise BadRecord('"prompt" must be a non-empty string')
        return [{"role": "user", "content": record["prompt"]}]
    turns = check_turns(record["messages"])
    if turns[-1]["role"] != "user":
        raise BadRecord(
            f'"messages" must end on a user turn (the last is {turns[-1]["role"]!r}): '
            "a prompt ends on a user turn, and the model writes the next assistant turn"
        )
    return turns


def chat_messages(record: Any) -> Messages:
    if not isinstance(record, dict) or "messages" not in record:
        raise BadRecord('a chat record is an object with "messages"')
    return _check_messages(record["messages"])


def alpaca_messages(record: Any) -> Messages:
    if not isinstance(record, dict):
        raise BadRecord('an alpaca record is an object with "instruction", "input" and "output"')
    for key in ("instruction", "output"):
        if not isinstance(record.get(key), str) or not record[key].strip():
            raise BadRecord(f'"{key}" must be a non-empty string')
    extra = record.get("input", "")
    if not isinstance(extra, str):
        raise BadRecord('"input" must be a string')
    user = record["instruction"] + (f"\n\n{extra}" if extra.strip() else "")
    return [{"role": "user", "content": user}, {"role": "assistant", "content": record["output"]}]


#: ``--format`` → record → messages.
RECORD_FORMATS: dict[str, Callable[[Any], Messages]] = {"chat": chat_messages, "alpaca": alpaca_messages}


def iter_records(path: Path) -> Iterator[tuple[int, Any]]:
    """``(line, record)`` of a JSONL file (or ``(index + 1, record)`` of a JSON array); bad JSON raises BadRecord."""
    if path.suffix.lower() == ".json":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise GptlabError(f"{path}: not valid JSON ({exc})") from None
        if not isinstance(data, list):
            raise GptlabError(f"{path}: a .json file must hold a list of records")
        yield from enumerate(data, 1)
        return
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                yield lineno, json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as exc:
                yield lineno, BadRecord(f"not valid JSON ({getattr(exc, 'msg', exc)})")


# ------------------------------------------------------------------ rendering
def _chatml(messages: Messages, add_generation_prompt: bool) -> str:
    """ChatML: ``<|im_start|>{role}\\n{content}<|im_end|>\\n`` per message."""
    # stand-in used only where gptlab.tokenizers.chat (the model's own templates) is not installed
    text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return text + ("<|im_start|>assistant\n" if add_generation_prompt else "")


Renderer = Callable[[Messages, bool], str]


def renderer(tokenizer: Tokenizer, template: str) -> tuple[Renderer, str]:
    """``(render(messages, add_generation_prompt), name)`` for ``template``: ``auto`` (the model's own, else
    the fallback its special tokens imply) or a named template (``chatml``, ``llama3``, ``plain``)."""
    try:
        from gptlab.tokenizers.chat import template_for
    except ImportError:
        if template not in ("auto", "chatml"):
            raise GptlabError(f"unknown chat template {template!r}; choose auto or chatml") from None
        return _chatml, "chatml"
    chosen = template_for(tokenizer, None if template == "auto" else template)
    return (lambda messages, gen: chosen.render(messages, add_generation_prompt=gen)), chosen.name


def segments(messages: Messages, render: Renderer) -> list[tuple[str, bool]]:
    """The rendered conversation cut into ``(text, is_assistant)`` pieces, in order.

    Each assistant turn is ``render(turns ≤ i)`` minus ``render(turns < i, generation prompt)``;
    a template that does not render a conversation as a prefix of its continuation is refused.
    """
    out: list[tuple[str, bool]] = []
    done = ""
    for i, m in enumerate(messages):
        if m["role"] != "assistant":
            continue
        prompt = render(messages[:i], True) if i else ""
        full = render(messages[: i + 1], False)
        if not prompt.startswith(done) or not full.startswith(prompt):
            raise GptlabError(
                "the chat template does not render a conversation as a prefix of its continuation; "
                "give another --template"
            )
        out += [(prompt[len(done) :], False), (full[len(prompt) :], True)]
        done = full
    rest = render(messages, False)[len(done) :]
    return out + ([(rest, False)] if rest else [])


def encode_example(
    messages: Messages, render: Renderer, tokenizer: Tokenizer, prompt_loss: bool
) -> tuple[list[int], list[int]]:
    """``(ids, mask)``: the tokens of one example and 1 where each counts in the loss."""
    ids: list[int] = []
    mask: list[int] = []
    for text, is_answer in segments(messages, render):
        piece = tokenizer.encode(text, allowed_special="all")
        ids += piece
        mask += [1 if (is_answer or prompt_loss) else 0] * len(piece)
    if mask:
        mask[0] = 0  # the first token of an example is never predicted from it
    return ids, mask


# ------------------------------------------------------------------ packing
@dataclass
class Rows:
    """Examples placed in rows of ``length`` tokens: tokens, loss mask and positions, flat."""

    length: int
    pad_id: int
    packed: bool
    tokens: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    pos: list[int] = field(default_factory=list)
    used: int = 0  # tokens in the current (last) row

    def add(self, ids: list[int], mask: list[int]) -> None:
        if not self.tokens or not self.packed or self.used + len(ids) > self.length:
            self._pad()
            self.used = 0
        self.tokens += ids
        self.mask += mask
        self.pos += range(len(ids))
        self.used += len(ids)

    def _pad(self) -> None:
        n = (self.length - self.used) if self.tokens else 0
        start = self.pos[-1] + 1 if self.tokens else 0
        self.tokens += [self.pad_id] * n
        self.mask += [0] * n
        self.pos += range(start, start + n)

    def close(self) -> None:
        self._pad()
        self.used = self.length


def fit(ids: list[int], mask: list[int], length: int, too_long: str) -> tuple[list[int], list[int]] | None:
    """An example cut to ``length`` tokens (``truncate``), or None (``drop``, or nothing left to learn)."""
    if len(ids) <= length:
        return ids, mask
    if too_long == "drop" or not any(mask[:length]):
        return None
    return ids[:length], mask[:length]


# ------------------------------------------------------------------ prepare
@dataclass
class ChatOptions:
    """The ``prepare`` settings of instruction data."""

    template: str = "auto"
    prompt_loss: bool = False
    packing: str = "packed"
    too_long: str = "truncate"
    skip_bad: bool = False


def read_examples(sources: Sequence[Path], fmt: str, skip_bad: bool) -> tuple[list[Messages], int]:
    """Every valid example of ``sources`` and the number of bad records skipped."""
    examples, bad = [], 0
    for path in sources:
        for lineno, record in iter_records(path):
            try:
                if isinstance(record, BadRecord):
                    raise record
                examples.append(RECORD_FORMATS[fmt](record))
            except BadRecord as exc:
                if not skip_bad:
                    raise GptlabError(
                        f"{path}:{lineno}: {exc} (fix it, or pass --skip-bad to skip bad records)"
                    ) from None
                bad += 1
    if not examples:
        raise GptlabError(f"no usable {fmt} examples in {', '.join(map(str, sources))}")
    return examples, bad


def prepare_examples(
    inputs: Sequence[PathLike],
    out_dir: PathLike,
    fmt: str,
    tokenizer: str,
    val_fraction: float = 0.1,
    block_size: int = 64,
    progress: bool = False,
    options: ChatOptions | None = None,
    model_tokenizer: Callable[[str], Any] | None = None,
) -> dict[str, Any]:
    """Render, tokenize, mask and pack ``inputs`` (``fmt``: chat or alpaca) into a dataset directory."""
    from gptlab.data.prepare import build_tokenizer, token_dtype

    opt = options or ChatOptions()
    if opt.packing not in PACKING or opt.too_long not in TOO_LONG:
        raise GptlabError(
            f"packing must be one of {', '.join(PACKING)} and too_long one of {', '.join(TOO_LONG)}"
        )
    out = new_dataset_dir(out_dir, val_fraction)
    sources = find_sources(inputs)
    if tokenizer in ("char",) or tokenizer.startswith("bpe:"):
        raise GptlabError(
            f"--format {fmt} needs the model's tokenizer: --tokenizer MODEL (checkpoint, Hugging Face "
            f"folder or GGUF file) or a saved tokenizer file"
        )
    tok = build_tokenizer(tokenizer, sources, model_tokenizer)
    render, template = renderer(tok, opt.template)
    examples, bad = read_examples(sources, fmt, opt.skip_bad)
    order = np.random.default_rng(0).permutation(len(examples))
    n_val = max(1, round(len(examples) * val_fraction)) if len(examples) > 1 else 0
    if n_val == 0:
        raise GptlabError("need at least 2 examples: one for training, one for validation")
    split_of = {int(i): ("val" if k < n_val else "train") for k, i in enumerate(order)}
    pad = tok.eot_id if tok.eot_id is not None else 0
    rows = {s: Rows(block_size + 1, pad, opt.packing == "packed") for s in ("train", "val")}
    counts = {"examples": 0, "truncated": 0, "dropped": 0, "skipped_bad": bad}
    nbytes = dict.fromkeys(rows, 0)
    for i, messages in enumerate(examples):
        ids, mask = encode_example(messages, render, tok, opt.prompt_loss)
        kept = fit(ids, mask, block_size + 1, opt.too_long)
        if kept is None:
            counts["dropped"] += 1
            continue
        counts["truncated"] += len(kept[0]) < len(ids)
        counts["examples"] += 1
        rows[split_of[i]].add(*kept)
        nbytes[split_of[i]] += len(tok.decode_bytes(kept[0]))
    for s, r in rows.items():
        r.close()
        if not r.tokens:
            raise GptlabError(f"no {s} example fits in --block-size {block_size}; raise it or add data")
    dtype = token_dtype(tok.vocab_size)
    pos_dtype = np.dtype(np.uint16) if block_size + 1 <= 1 << 16 else np.dtype(np.uint32)
    with staged_directory(out) as stage:
        for s, r in rows.items():
            np.asarray(r.tokens, dtype=dtype).tofile(stage / f"{s}.bin")
            np.asarray(r.mask, dtype=np.uint8).tofile(stage / f"{s}.mask.bin")
            if r.packed:
                np.asarray(r.pos, dtype=pos_dtype).tofile(stage / f"{s}.pos.bin")
        tok.save(stage / TOKENIZER_FILE)
        meta = {
            "format": DATASET_FORMAT,
            "data_format": fmt,
            "dtype": dtype.name,
            "pos_dtype": pos_dtype.name if opt.packing == "packed" else None,
            "vocab_size": tok.vocab_size,
            "eot_id": tok.eot_id,
            "row_tokens": block_size + 1,
            "template": template,
            "loss_on": "all" if opt.prompt_loss else "assistant",
            "packing": opt.packing,
            "too_long": opt.too_long,
            **counts,
            "documents": counts["examples"],
            "train_tokens": len(rows["train"].tokens),
            "val_tokens": len(rows["val"].tokens),
            "train_bytes": max(nbytes["train"], 1),
            "val_bytes": max(nbytes["val"], 1),
            "tokenizer": tokenizer,
            "tokenizer_kind": getattr(tok, "kind", None),
            "val_fraction": val_fraction,
            "sources": describe_sources(sources),
        }
        atomic_write_json(stage / META_FILE, meta)
    return meta


def prepare_chat(inputs: Sequence[PathLike], out_dir: PathLike, **kwargs: Any) -> dict[str, Any]:
    return prepare_examples(inputs, out_dir, "chat", **kwargs)


def prepare_alpaca(inputs: Sequence[PathLike], out_dir: PathLike, **kwargs: Any) -> dict[str, Any]:
    return prepare_examples(inputs, out_dir, "alpaca", **kwargs)
