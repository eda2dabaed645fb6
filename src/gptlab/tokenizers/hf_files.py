"""Hugging Face tokenizer files (``tokenizer.json`` + ``tokenizer_config.json``) ↔ gptlab tokenizers.

Reading: a byte-level BPE ``tokenizer.json`` (vocabulary, merges, added tokens, pre-tokenizer) and
its ``tokenizer_config.json`` (bos/eos, chat template) become a ``PretrainedTokenizer``; the
``WordLevel`` form written for a ``char`` tokenizer (below) becomes that ``CharTokenizer`` again.

Writing: every gptlab tokenizer that transformers has a form for, so that
``transformers.pipeline("text-generation", model=DIR)`` runs with no other input:

* byte-level BPE (``pretrained``, ``gpt2``, ``bpe``): a ``BPE`` model over GPT-2's byte alphabet with
  the merges in rank order, the split pattern as ``ByteLevel`` (GPT-2's) or ``Split`` + ``ByteLevel``;
* ``char``: a ``WordLevel`` model over single characters, ``Split`` into characters, ``Fuse`` to decode.

Special tokens are added tokens matched whole, and each is also an entry of the model's vocabulary at its
own id: ``tokenizers`` gives an added token that is not in the vocabulary a new id after the largest
one (SmolLM2's ``<|im_start|>``, id 1, would become 49,152 + …), so only an entry in both keeps gptlab's
ids. No ``tokenizers`` import: the JSON is written by hand.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from gptlab.errors import GptlabError
from gptlab.fileio import atomic_write_json
from gptlab.tokenizers.base import Tokenizer
from gptlab.tokenizers.byte_unicode import bytes_to_token
from gptlab.tokenizers.char import CharTokenizer
from gptlab.tokenizers.patterns import PATTERNS
from gptlab.tokenizers.pretrained import PretrainedTokenizer
from gptlab.tokenizers.ranked import RankedTokenizer

TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
MASK_TOKEN = "[MASK]"  # the special token gptlab's masked-LM objective adds (train/objectives.py)

# Hugging Face's spelling (Oniguruma: no possessive quantifiers) of the split patterns that are not GPT-2's.
HF_SPLITS = {
    "gpt4": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
    r"\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": PATTERNS["qwen2"],
}
_BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
_DIGITS = {"type": "Digits", "individual_digits": True}
_CHAR_SPLIT = {"type": "Split", "pattern": {"Regex": r"[\s\S]"}, "behavior": "Isolated", "invert": False}


# ------------------------------------------------------------------ reading
def _read(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise GptlabError(f"{path}: cannot read it as JSON ({exc})") from None


def _pattern(pre: Any, path: Path) -> str:
    """The split pattern a byte-level ``pre_tokenizer`` describes."""
    steps = pre.get("pretokenizers", []) if isinstance(pre, dict) and pre.get("type") == "Sequence" else [pre]
    kinds = [s.get("type") if isinstance(s, dict) else None for s in steps]
    if kinds == ["ByteLevel"] and steps[0].get("use_regex", True):
        return "gpt2"
    if (
        kinds == ["Digits", "ByteLevel"]
        and steps[0].get("individual_digits")
        and steps[1].get("use_regex", True)
    ):
        return "gpt2-digits"
    if kinds == ["Split", "ByteLevel"] and not steps[1].get("use_regex", True):
        regex = (steps[0].get("pattern") or {}).get("Regex")
        if isinstance(regex, str) and steps[0].get("behavior") in ("Isolated", "isolated"):
            return next((name for name, hf in HF_SPLITS.items() if hf == regex), regex)
    raise GptlabError(f"{path}: pre_tokenizer {kinds} is not a byte-level BPE split gptlab reads")


def _token_text(value: Any) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


def _adds_bos(config: dict[str, Any], data: dict[str, Any], bos: str | None) -> bool:
    """Whether encoding puts BOS first: ``tokenizer_config.json``'s ``add_bos_token``, else a ``tokenizer.json``
    post-processor whose single-text template starts with the bos token (Llama 3's)."""
    if "add_bos_token" in config:
        return bool(config["add_bos_token"])
    post = data.get("post_processor") or {}
    steps = post.get("processors", [post]) if isinstance(post, dict) else []
    for step in steps:
        single = step.get("single") if isinstance(step, dict) else None
        if step.get("type") == "TemplateProcessing" and isinstance(single, list) and single:
            first = single[0].get("SpecialToken", {}).get("id") if isinstance(single[0], dict) else None
            return first is not None and first == bos
    return False


def read_hf_tokenizer(directory: str | os.PathLike[str]) -> PretrainedTokenizer | CharTokenizer | None:
    """The byte-level BPE of a folder's ``tokenizer.json`` (+ ``tokenizer_config.json``), or ``None`` without one."""
    directory = Path(directory)
    path = directory / TOKENIZER_JSON
    if not path.is_file():
        return None
    data = _read(path)
    model = data.get("model") if isinstance(data, dict) else None
    if (
        isinstance(model, dict)
        and model.get("type") == "WordLevel"
        and data.get("pre_tokenizer") == _CHAR_SPLIT
    ):
        return _read_char(model, data.get("added_tokens", []), path)
    if not isinstance(model, dict) or model.get("type") != "BPE":
        kind = model.get("type") if isinstance(model, dict) else None
        raise GptlabError(f"{path}: tokenizer model {kind!r} is not supported; gptlab reads byte-level BPE")
    if data.get("normalizer") is not None:
        raise GptlabError(f"{path}: a normalizer ({data['normalizer'].get('type')}) is not supported")
    pattern = _pattern(data.get("pre_tokenizer"), path)
    by_id: dict[int, str] = {int(i): t for t, i in model.get("vocab", {}).items()}
    added = {int(a["id"]): a["content"] for a in data.get("added_tokens", [])}
    by_id.update(added)
    if sorted(by_id) != list(range(len(by_id))):
        raise GptlabError(f"{path}: the token ids have gaps; gptlab needs ids 0..V-1")
    config = _read(directory / TOKENIZER_CONFIG) if (directory / TOKENIZER_CONFIG).is_file() else {}
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    ids = {t: i for i, t in by_id.items()}
    bos, eos = (_token_text(config.get(k)) for k in ("bos_token", "eos_token"))
    try:
        return PretrainedTokenizer(
            [by_id[i] for i in range(len(by_id))],
            model.get("merges", []),
            special_ids=added,
            pattern=pattern,
            bos_id=ids.get(bos) if bos else None,
            eos_id=ids.get(eos) if eos else None,
            add_bos=_adds_bos(config, data, bos),
            chat_template=template,
        )
    except GptlabError as exc:
        raise GptlabError(f"{path}: {exc}") from None


def _read_char(model: dict[str, Any], added: list[Any], path: Path) -> CharTokenizer:
    """The ``char`` tokenizer that ``write_hf_tokenizer`` wrote as a ``WordLevel`` model (ids checked)."""
    vocab: dict[str, int] = model.get("vocab", {})
    specials = {a["content"]: int(a["id"]) for a in added if isinstance(a, dict) and a.get("special")}
    unk = model.get("unk_token") if model.get("unk_token") in vocab else None
    pieces = sorted((i, t) for t, i in vocab.items() if t not in specials and t != unk)
    try:
        tok = CharTokenizer([t for _, t in pieces], unk=unk, special_tokens=specials)
    except GptlabError as exc:
        raise GptlabError(f"{path}: {exc}") from None
    ids = {c: i for i, c in enumerate(tok.chars)} | specials | ({unk: tok.unk_id} if unk is not None else {})
    if ids != vocab:
        raise GptlabError(f"{path}: this WordLevel vocabulary is not a gptlab character tokenizer's")
    return tok


# ------------------------------------------------------------------ writing
def _split_by_rank(token: bytes, ranks: Mapping[bytes, int]) -> tuple[bytes, bytes]:
    """The merge that made ``token``: BPE over its bytes with only the ranks below its own, down to two parts."""
    limit = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        pairs = [(ranks.get(a + b, limit), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        rank, i = min(pairs)
        if rank >= limit:
            break
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) != 2:
        raise GptlabError(f"the token {token!r} is not the merge of two earlier tokens; it has no BPE merge")
    return parts[0], parts[1]


def _bpe_model(tok: Tokenizer) -> dict[str, Any]:
    assert isinstance(tok, RankedTokenizer)  # HF_FORMS: the byte-level BPE kinds
    ranks: dict[bytes, int] = tok.ranks
    vocab = {bytes_to_token(t): i for t, i in sorted(ranks.items(), key=lambda kv: kv[1])}
    if isinstance(tok, PretrainedTokenizer):
        merges = list(tok.merges)
        vocab = {t: i for i, t in enumerate(tok.tokens)}
    else:
        merged = sorted((i, t) for t, i in ranks.items() if len(t) > 1)
        merges = [" ".join(map(bytes_to_token, _split_by_rank(t, ranks))) for _, t in merged]
    return {
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": merges,
        },  # fmt: skip
        "pre_tokenizer": _pre_tokenizer(tok.pattern),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    }


def _pre_tokenizer(pattern: str) -> dict[str, Any]:
    if pattern == "gpt2":
        return dict(_BYTE_LEVEL)
    if pattern == "gpt2-digits":
        return {"type": "Sequence", "pretokenizers": [dict(_DIGITS), dict(_BYTE_LEVEL)]}
    split = {"type": "Split", "pattern": {"Regex": HF_SPLITS.get(pattern, pattern)}, "behavior": "Isolated"}
    return {
        "type": "Sequence",
        "pretokenizers": [{**split, "invert": False}, {**_BYTE_LEVEL, "use_regex": False}],
    }


def _char_model(tok: Tokenizer) -> dict[str, Any]:
    assert isinstance(tok, CharTokenizer)  # HF_FORMS: "char"
    vocab = {c: i for i, c in enumerate(tok.chars)}
    if tok.unk is not None and tok.unk_id is not None:  # (the one is set with the other)
        vocab[tok.unk] = tok.unk_id
    return {
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": tok.unk or "<unk>"},
        "pre_tokenizer": dict(_CHAR_SPLIT),
        "decoder": {"type": "Fuse"},
    }


#: tokenizer kind → its transformers form.
HF_FORMS: dict[str, Callable[[Tokenizer], dict[str, Any]]] = {
    "pretrained": _bpe_model,
    "gpt2": _bpe_model,
    "bpe": _bpe_model,
    "char": _char_model,
}


def hf_tokenizer_json(tok: Tokenizer) -> dict[str, Any]:
    """The ``tokenizer.json`` of ``tok`` (a ``GptlabError`` for a kind transformers has no form of)."""
    form = HF_FORMS.get(tok.kind)
    if form is None:
        raise GptlabError(
            f"a {tok.kind!r} tokenizer has no Hugging Face form; gptlab writes {', '.join(HF_FORMS)}"
        )
    added = [
        {"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False,
         "special": True}
        for s, i in sorted(tok.special_tokens.items(), key=lambda kv: kv[1])
    ]  # fmt: skip
    data = form(tok)
    data["model"]["vocab"].update(tok.special_tokens)  # in the vocabulary too, so that they keep their ids
    return {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "post_processor": None, **data}  # fmt: skip


def write_hf_tokenizer(tok: Tokenizer, directory: str | os.PathLike[str], model_max_length: int) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (bos/eos, chat template) into ``directory``."""
    directory = Path(directory)
    data = hf_tokenizer_json(tok)
    eos = getattr(tok, "eos_token", None) or next(
        iter(s for s, i in tok.special_tokens.items() if i == tok.eot_id), None
    )
    bos = getattr(tok, "bos_token", None)
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": model_max_length,
        "clean_up_tokenization_spaces": False,
        "add_bos_token": bool(getattr(tok, "add_bos", False)),
    }
    config.update({k: v for k, v in (("bos_token", bos), ("eos_token", eos)) if v is not None})
    if tok.kind == "char":
        config["unk_token"] = data["model"]["unk_token"]
    if MASK_TOKEN in tok.special_tokens:  # a masked-LM's tokenizer: pipeline("fill-mask") looks for it
        config["mask_token"] = MASK_TOKEN
    if tok.chat_template is not None:
        from gptlab.tokenizers.chat import FALLBACKS

        config["chat_template"] = FALLBACKS.get(tok.chat_template, tok.chat_template)
    atomic_write_json(directory / TOKENIZER_JSON, data)
    atomic_write_json(directory / TOKENIZER_CONFIG, config)


__all__ = ["HF_FORMS", "hf_tokenizer_json", "read_hf_tokenizer", "write_hf_tokenizer"]
