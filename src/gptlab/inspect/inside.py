"""Inside: the blueprint's pipeline for one input, as data for the playground's Inside view.

One recorded forward pass (``recording.record``) gives every stage, in the blueprint's order:

    1. tokens        x = T(text)                                       (T,)
    2. embedding     e_i = W_e[x_i]                                     (T, d_model)
    3. position      h⁽⁰⁾_i = e_i + p_i, or RoPE's angles / ALiBi's slopes inside attention
    4. blocks        h' = h + MultiHead(LN(h)),  h⁽ˡ⁾ = h' + FFN(LN(h'))    per block, as norms per position
    5. final norm    h_out = norm_f(h⁽ᴺ⁾)                               (T, d_model)
    6. logits        z = h_out·W_eᵀ                                     (T, V)
    7. next token    p = softmax(z_T/τ), then top-k, top-p, min-p       (V,)

and two views across the stack: the attention weights ``A = softmax(Q·Kᵀ/√d_k + M)`` of every
layer and head (``attentions``, left as tensors: a server sends one layer at a time), and the
logit lens ``softmax(head(norm_f(h⁽ˡ⁾_i)))`` of every layer (``lens.logit_lens``). Each stage
carries its equation, its shape and the section of ``docs/guide/inside.md`` that explains it.

The lens, the logits' statistics and the distribution are read at one position ``i``. By default
it is the one whose prediction the model is for (``DEFAULT_POSITIONS``, by architecture): the last
for a decoder (the next token) and an encoder–decoder (the next target token); for a masked-language
encoder, the first ``[MASK]`` (else the last), where ``p = P(x_i | x̃)`` is the missing token.
The logits at ``i`` are kept whole (``next_logits``) so that a client can apply the sampling
filters itself (``gptlab.generate.sampling`` defines them) without asking again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from gptlab.errors import GptlabError
from gptlab.inspect.fill import MASK
from gptlab.inspect.inputs import token_label
from gptlab.inspect.lens import logit_lens
from gptlab.inspect.recording import ModelInput, Recording, model_input, record
from gptlab.inspect.trace_positions import POSITION_STAGES, round_list
from gptlab.inspect.tracing import logit_stats
from gptlab.model import GPT

GUIDE = "docs/guide/inside.md"
MAX_TOP = 50  # tokens per lens layer and bars of the distribution, at most

#: A block's two (an encoder–decoder decoder's three) sublayers, by norm placement.
BLOCK_EQUATIONS = {
    "pre": "h' = h + MultiHead(LN(h)),  h⁽ˡ⁾ = h' + FFN(LN(h'))",
    "post": "h' = LN(h + MultiHead(h)),  h⁽ˡ⁾ = LN(h' + FFN(h'))",
}
CROSS_EQUATIONS = {
    "pre": "h' = h + MaskedMultiHead(LN(h)),  h'' = h' + CrossAttn(LN(h'), H_enc),  h⁽ˡ⁾ = h'' + FFN(LN(h''))",
    "post": "h' = LN(h + MaskedMultiHead(h)),  h'' = LN(h' + CrossAttn(h', H_enc)),  h⁽ˡ⁾ = LN(h'' + FFN(h''))",
}
FINAL_EQUATIONS = {
    "pre": "h_out = norm_f(h⁽ᴺ⁾)",
    "post": "h_out = h⁽ᴺ⁾  (post-norm: every block already ends with its norm)",
}
#: What the distribution at the chosen position i predicts, by architecture.
PREDICTS = {
    "decoder": "the next token, after position i",
    "encoder-decoder": "the next target token, after position i",
    "encoder": (
        "the token at position i, as a masked-language model sees it from both sides: P(x_i | x̃) "
        "(at a [MASK], the missing token; the raw distribution: [MASK] itself keeps its probability, "
        "which Fill leaves out)"
    ),
}
#: The distribution stage's equation, by architecture.
SAMPLED = "p = softmax(z_i/τ); then top-k, top-p, min-p keep a prefix of the tokens by probability"
DISTRIBUTION_EQUATIONS = {
    "decoder": SAMPLED,
    "encoder-decoder": SAMPLED,
    "encoder": "P(x_i | x̃) = softmax(z_i/τ); top-k, top-p, min-p shown as a sampler would apply them",
}
ATTENTION_KINDS = {  # kind → (title, equation, rows, columns)
    "self": ("self-attention", "A = softmax(Q·Kᵀ/√d_k + M)", "tokens", "tokens"),
    "cross": ("cross-attention", "A = softmax(Q_dec·K_encᵀ/√d_k)", "tokens", "source_tokens"),
    "encoder": ("encoder self-attention", "A = softmax(Q·Kᵀ/√d_k)", "source_tokens", "source_tokens"),
}
#: a masked-language encoder's own self-attention: no mask, every position sees every other
BIDIRECTIONAL = ("bidirectional self-attention", "A = softmax(Q·Kᵀ/√d_k)  (no mask)", "tokens", "tokens")


@dataclass
class Inside:
    """The Inside view of one input: ``overview`` (JSON-ready), attention tensors and the logits at ``position``."""

    overview: dict[str, Any]
    attentions: dict[str, torch.Tensor]  # kind → (L, H, T_q, T_k) float32
    next_logits: torch.Tensor  # (V,) float32: the logits at ``position``
    position: int  # the position the lens and the distribution are read at (0 … T − 1)
    top: int  # tokens per lens row and bars


def _last(ids: Sequence[int], mask_id: int | None) -> int:
    return len(ids) - 1


def _first_mask(ids: Sequence[int], mask_id: int | None) -> int:
    return next((i for i, t in enumerate(ids) if t == mask_id), len(ids) - 1)


#: Where the lens and the distribution are read when no position is given, by architecture.
DEFAULT_POSITIONS: dict[str, Callable[[Sequence[int], int | None], int]] = {
    "decoder": _last,
    "encoder-decoder": _last,
    "encoder": _first_mask,
}


def resolve_position(model: GPT, tokenizer: Any | None, ids: Sequence[int], position: int | None) -> int:
    """``position`` in ``0 … T − 1`` (negative counts from the end, and a position past either end is
    that end), or the architecture's default (``DEFAULT_POSITIONS``) when None."""
    if position is None:
        mask_id = (getattr(tokenizer, "special_tokens", None) or {}).get(MASK)
        return DEFAULT_POSITIONS[model.config.arch](ids, mask_id)
    found = position if position >= 0 else len(ids) + position
    return min(max(found, 0), len(ids) - 1)


def stage(name: str, title: str, equation: str, shape: Sequence[int], **data: Any) -> dict[str, Any]:
    """One stage of the pipeline: its equation, its shape and the guide's section on it."""
    anchor = title.lower().replace(" ", "-")
    return {
        "name": name,
        "title": title,
        "equation": equation,
        "shape": list(shape),
        "guide": f"{GUIDE}#{anchor}",
        **data,
    }


def norms(x: torch.Tensor) -> list[float]:
    """``‖x_i‖`` for every row of ``x`` (T, d), to 4 decimals."""
    return round_list(x.float().norm(dim=-1).tolist())


@torch.no_grad()
def inside(
    model: GPT,
    tokenizer: Any | None,
    text: str | Sequence[int] | torch.Tensor,
    top: int = 10,
    target: str | None = None,
    position: int | None = None,
) -> Inside:
    """Run ``text`` once and gather every stage, the attention weights and the logit lens.

    ``top`` tokens per lens layer and bars of the distribution (1..``MAX_TOP``), read at
    ``position`` (``resolve_position``: by default the last, or an encoder's first ``[MASK]``).
    An encoder–decoder reads ``text`` as its source and BOS + ``target`` as its decoder input;
    its positions are the target's.
    """
    if not isinstance(top, int) or not 1 <= top <= MAX_TOP:
        raise GptlabError(f"top must be an integer in 1..{MAX_TOP}, got {top!r}")
    inp = model_input(model, tokenizer, text, target)
    pos = resolve_position(model, tokenizer, inp.ids, position)
    rec = record(model, inp, sublayers=True)
    c = model.config
    V = rec.logits.size(-1)
    at = rec.logits[pos]
    top_i = at.topk(min(top, V)).indices.tolist()
    overview = {
        "arch": c.arch,
        "causal": c.causal,
        "position": pos,
        "config": {
            k: getattr(c, k) for k in ("n_layer", "n_head", "n_kv_head", "n_embd", "d_ff", "vocab_size")
        },
        "tokens": _tokens(inp.ids, inp.labels),
        "source_tokens": _tokens(inp.source, inp.source_labels) if inp.source is not None else None,
        "stages": [builder(model, inp, rec, pos) for builder in STAGES],
        "attention": {
            kind: dict(
                zip(("title", "equation", "rows", "columns"), _attention_kind(bool(c.causal), kind)),
                shape=list(maps.shape),
                guide=f"{GUIDE}#attention",
            )
            for kind, maps in rec.attentions.items()
        },
        "lens": {
            "title": "Logit lens",
            "equation": "p⁽ˡ⁾ = softmax(head(norm_f(h⁽ˡ⁾_i)))",
            "guide": f"{GUIDE}#logit-lens",
            "position": pos,
            "layers": logit_lens(model, tokenizer, rec.hidden, pos, top),
        },
        "distribution": {
            "position": pos,
            "predicts": PREDICTS[c.arch],
            "top": [{"id": i, "token": token_label(tokenizer, i)} for i in top_i],
        },
    }
    return Inside(overview, rec.attentions, at, pos, top)


def _attention_kind(causal: bool, kind: str) -> tuple[str, str, str, str]:
    """(title, equation, rows, columns) of an attention kind; a bidirectional model's "self" has no mask."""
    return {**ATTENTION_KINDS, "self": {True: ATTENTION_KINDS["self"], False: BIDIRECTIONAL}[causal]}[kind]


def _tokens(ids: Sequence[int], labels: Sequence[str]) -> list[dict[str, Any]]:
    return [{"position": i, "id": t, "token": lab} for i, (t, lab) in enumerate(zip(ids, labels))]


# ------------------------------------------------------------------ the stages, in order
def _tokens_stage(model: GPT, inp: ModelInput, rec: Recording, pos: int) -> dict[str, Any]:
    return stage("tokens", "Tokens", "x = T(text)", [len(inp.ids)])


def _embedding_stage(model: GPT, inp: ModelInput, rec: Recording, pos: int) -> dict[str, Any]:
    return stage(
        "embedding",
        "Token embeddings",
        "e_i = W_e[x_i]",
        rec.embeddings.shape,
        table_shape=[model.config.vocab_size, model.config.n_embd],
        norms=norms(rec.embeddings),
    )


def _position_stage(model: GPT, inp: ModelInput, rec: Recording, pos: int) -> dict[str, Any]:
    found = POSITION_STAGES[model.config.pos](model, len(inp.ids), inp.labels)
    for key in ("rows", "shape"):  # the table's numbers (the trace prints them); the view shows norms
        found.pop(key, None)
    return stage(
        "position",
        "Position",
        found.pop("formula"),
        rec.hidden[0].shape,
        kind=model.config.pos,
        input_norms=norms(rec.hidden[0]),
        **found,
    )


def _blocks_stage(model: GPT, inp: ModelInput, rec: Recording, pos: int) -> dict[str, Any]:
    placement = model.config.norm_placement
    equations = CROSS_EQUATIONS if "cross_attention" in rec.sublayers else BLOCK_EQUATIONS
    layers = []
    for layer, h in enumerate(rec.hidden[1:]):
        entry = {name: norms(outputs[layer]) for name, outputs in rec.sublayers.items()}
        layers.append({"layer": layer, **entry, "residual": norms(h)})
    return stage(
        "blocks",
        "Blocks",
        equations[placement],
        rec.hidden[-1].shape,
        placement=placement,
        sublayers=list(rec.sublayers),
        layers=layers,
    )


def _final_stage(model: GPT, inp: ModelInput, rec: Recording, pos: int) -> dict[str, Any]:
    placement = model.config.norm_placement
    return stage("final", "Final norm", FINAL_EQUATIONS[placement], rec.final.shape, norms=norms(rec.final))


def _logits_stage(model: GPT, inp: ModelInput, rec: Recording, pos: int) -> dict[str, Any]:
    cap = model.config.logit_softcap
    equation = "z = h_out·W_eᵀ" + (f",  z ← {cap:g}·tanh(z/{cap:g})" if cap else "")
    return stage(
        "logits", "Logits", equation, rec.logits.shape, position=pos, at=logit_stats(rec.logits[pos])
    )


def _distribution_stage(model: GPT, inp: ModelInput, rec: Recording, pos: int) -> dict[str, Any]:
    return stage(
        "distribution",
        "Next token",
        DISTRIBUTION_EQUATIONS[model.config.arch],
        [rec.logits.size(-1)],
        position=pos,
        predicts=PREDICTS[model.config.arch],
    )


STAGES: list[Callable[[GPT, ModelInput, Recording, int], dict[str, Any]]] = [
    _tokens_stage,
    _embedding_stage,
    _position_stage,
    _blocks_stage,
    _final_stage,
    _logits_stage,
    _distribution_stage,
]

__all__ = [
    "ATTENTION_KINDS",
    "DEFAULT_POSITIONS",
    "GUIDE",
    "MAX_TOP",
    "STAGES",
    "Inside",
    "inside",
    "resolve_position",
    "stage",
]
