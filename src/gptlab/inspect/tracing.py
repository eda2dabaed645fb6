"""``trace``: the blueprint's pipeline ("The cat sat on" → next token), stage by stage.

    1. tokens         x = T(text)                                  (T,)
    2. embedding      e_i = W_e[x_i]                                (T, d_model)
    3. position       h⁽⁰⁾_i = e_i + p_i   (learned / sinusoidal; RoPE and ALiBi act inside attention)
    4. blocks         h⁽ˡ⁾ = Block_l(h⁽ˡ⁻¹⁾), attention A = softmax(Q·Kᵀ/√d_k + M)   (H, T, T)
    5. final state    h_out = norm(h⁽ᴺ⁾)                            (T, d_model)
    6. logits         z = h_out·W_eᵀ                                (T, V)
    7. next token     p = softmax(z_T / τ)                          (V,)

The forward pass runs once with ``output_attentions=True`` (the plain attention
path), so the weights shown are the ones the model used. For an encoder–decoder the
text is the source: an encoder stage (bidirectional blocks over the source) comes
first, the stages above follow the decoder (input: BOS + ``target``), and each
decoder block also shows its cross-attention, ``softmax(Q_dec·K_encᵀ/√d_k)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import torch

from gptlab.errors import GptlabError
from gptlab.inspect.inputs import token_label
from gptlab.inspect.recording import model_input, record
from gptlab.inspect.trace_positions import N_VALUES, POSITION_STAGES, first_values, round_list
from gptlab.model import GPT

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

TOP_ATTENTION = 3  # earlier tokens shown per head


@dataclass
class Trace:
    """Everything ``gptlab trace`` shows; ``to_dict()`` is the ``--json`` output, ``render()`` the text."""

    text: str | None
    model: dict[str, Any]
    tokens: list[dict[str, Any]]  # {position, id, token}
    embedding: dict[str, Any]  # shape, table_shape, rows: [{position, token, values}]
    position: dict[str, Any]  # kind, where, formula, shape?, rows? / values
    input_norms: list[float]  # ‖h⁽⁰⁾_i‖ per position
    layers: list[dict[str, Any]]  # {layer, residual_norms, attention: [{head, kv_head, top: [...]}]}
    final: dict[str, Any]  # shape, norm, values (last position, after the final norm)
    logits: dict[str, Any]  # shape, last-position statistics
    temperature: float
    next_tokens: list[dict[str, Any]]  # {id, token, logit, prob}
    encoder: dict[str, Any] | None = None  # encoder–decoder: {tokens, layers: [{layer, attention}]}

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def render(self) -> str:
        return "\n".join(_render(self)) + "\n"


# ------------------------------------------------------------------- trace
@torch.no_grad()
def trace(
    model: GPT,
    tokenizer: Tokenizer | None,
    text: str | Sequence[int] | torch.Tensor,
    temperature: float = 1.0,
    top: int = 10,
    target: str | None = None,
) -> Trace:
    """Run ``text`` (or a list of token ids) through ``model`` and record every stage.

    ``temperature`` τ scales the last logits before the softmax, ``p = softmax(z/τ)``;
    τ = 0 is greedy (all probability on the arg-max). ``top`` next tokens are listed.
    """
    if not isinstance(temperature, int | float) or math.isnan(temperature) or temperature < 0:
        raise GptlabError(f"temperature must be a number ≥ 0 (0 = greedy), got {temperature!r}")
    if not isinstance(top, int) or top < 1:
        raise GptlabError(f"top must be a positive integer, got {top!r}")
    inp = model_input(model, tokenizer, text, target)
    ids, labels, src, src_labels = inp.ids, inp.labels, inp.source or [], inp.source_labels
    c = model.config
    T = len(ids)
    rec = record(model, inp)
    tok_emb, hidden, final = rec.embeddings, rec.hidden, rec.final
    logits = rec.logits  # (T, V)
    last = logits[-1]  # (V,)
    probs = _probabilities(last, temperature)
    k = min(top, last.numel())
    top_p, top_i = probs.topk(k)

    layers = []
    cross = rec.attentions.get("cross")
    for layer, (h, attn) in enumerate(zip(hidden[1:], rec.attentions["self"])):
        norms = round_list(h.float().norm(dim=-1).tolist())
        layers.append({"layer": layer, "residual_norms": norms, "attention": _heads(attn, labels, c.n_rep)})
        if cross is not None:  # the last target position over the source tokens
            layers[-1]["cross_attention"] = _heads(cross[layer], src_labels, c.n_rep)
    encoder = None
    if "encoder" in rec.attentions:
        encoder = {
            "tokens": [
                {"position": i, "id": t, "token": lab} for i, (t, lab) in enumerate(zip(src, src_labels))
            ],
            "layers": [
                {"layer": i, "attention": _heads(a, src_labels, c.n_rep)}
                for i, a in enumerate(rec.attentions["encoder"])
            ],
        }
    position = {"kind": c.pos, **POSITION_STAGES[c.pos](model, T, labels)}
    return Trace(
        text=text if isinstance(text, str) else None,
        model={
            k: getattr(c, k)
            for k in (
                "vocab_size",
                "block_size",
                "n_layer",
                "n_head",
                "n_kv_head",
                "n_embd",
                "d_ff",
                "pos",
                "norm",
                "norm_placement",
                "mlp",
                "n_experts",
                "tie_embeddings",
            )
        },
        tokens=[{"position": i, "id": t, "token": lab} for i, (t, lab) in enumerate(zip(ids, labels))],
        embedding={
            "shape": list(tok_emb.shape),
            "table_shape": [model.wte.num_embeddings, model.wte.embedding_dim],
            "rows": first_values(tok_emb, labels),
        },
        position=position,
        input_norms=round_list(hidden[0].float().norm(dim=-1).tolist()),
        layers=layers,
        final={
            "shape": list(final.shape),
            "norm": round(float(final[-1].float().norm()), 4),
            "values": round_list(final[-1][:N_VALUES].tolist()),
            "where": "after the final norm" if c.norm_placement == "pre" else "the last block's output",
        },
        logits={"shape": list(logits.shape), **logit_stats(last), "softcap": c.logit_softcap},
        temperature=float(temperature),
        next_tokens=[
            {"id": int(i), "token": token_label(tokenizer, int(i)), "logit": float(last[i]), "prob": float(p)}
            for p, i in zip(top_p, top_i)
        ],
        encoder=encoder,
    )


def logit_stats(last: torch.Tensor) -> dict[str, float]:
    """Minimum, maximum, mean and standard deviation of one position's logits ``(V,)``, to 4 decimals."""
    return {
        "min": round(float(last.min()), 4),
        "max": round(float(last.max()), 4),
        "mean": round(float(last.mean()), 4),
        "std": round(float(last.std()), 4) if last.numel() > 1 else 0.0,
    }


def _heads(attn: torch.Tensor, labels: list[str], n_rep: int) -> list[dict[str, Any]]:
    """Per head, the ``TOP_ATTENTION`` keys the last query attends to most. attn: (H, T_q, T_k)."""
    heads = []
    for head in range(attn.size(0)):
        w, j = attn[head, -1].float().topk(min(TOP_ATTENTION, attn.size(-1)))
        top = [
            {"position": int(p), "token": labels[int(p)], "weight": round(float(x), 4)} for x, p in zip(w, j)
        ]
        heads.append({"head": head, "kv_head": head // n_rep, "top": top})
    return heads


def _probabilities(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """``softmax(z/τ)``; τ = 0 puts all probability on the arg-max."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(), logits.numel()).float()
    return torch.softmax(logits / temperature, dim=-1)


# ------------------------------------------------------------------ render
def _vec(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:+.4f}" for v in values) + ", …]"


def _shape(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ")"


def _quoted(label: str) -> str:
    return f"'{label}'"


def _sample_rows(rows: list[dict[str, Any]], limit: int = 6) -> list[dict[str, Any] | None]:
    """At most ``limit`` rows: the first ones, a gap (None), and the last."""
    if len(rows) <= limit:
        return list(rows)
    return [*rows[: limit - 2], None, rows[-1]]


def _render(t: Trace) -> list[str]:
    m = t.model
    T = len(t.tokens)
    width = max(len(_quoted(x["token"])) for x in t.tokens)
    head = f"{t.text!r}" if t.text is not None else f"ids {[x['id'] for x in t.tokens]}"
    experts = f" ×{m['n_experts']} experts" if m["n_experts"] else ""
    lines = [
        f"gptlab trace {head}",
        f"  model: {m['n_layer']} layers, d_model={m['n_embd']}, {m['n_head']} heads "
        f"({m['n_kv_head']} KV), d_ff={m['d_ff']} {m['mlp']}{experts}, pos={m['pos']}, "
        f"{m['norm_placement']}-{m['norm']}, vocab {m['vocab_size']}, context {m['block_size']}",
        "",
    ]

    lines.append(f"1. Tokens   x = T(text): {T} tokens, shape ({T},)")
    lines.append(f"   {'pos':>4}  {'id':>6}  token")
    for x in t.tokens:
        lines.append(f"   {x['position']:>4}  {x['id']:>6}  {_quoted(x['token'])}")
    lines.append("")
    if t.encoder is not None:
        src = "".join(x["token"] for x in t.encoder["tokens"])
        lines.append(f"1b. Encoder: {len(t.encoder['layers'])} bidirectional blocks over the source {src!r}")
        lines.append(
            "   (tokens above are the decoder's input: BOS + target; attention of the last source token)"
        )
        for layer in t.encoder["layers"]:
            lines.append(f"   encoder block {layer['layer']}:")
            lines += _head_lines(layer["attention"], "head")
        lines.append("")

    e = t.embedding
    lines.append(
        f"2. Token embeddings   e_i = W_e[x_i]: {_shape(e['shape'])}, rows of W_e {_shape(e['table_shape'])}"
    )
    for r in _sample_rows(e["rows"]):
        lines.append(
            "   …"
            if r is None
            else f"   {r['position']:>4}  {_quoted(r['token']):<{width}}  {_vec(r['values'])}"
        )
    lines.append("")

    p = t.position
    lines.append(f"3. Position ({p['kind']}): {p['where']}")
    lines.append(f"   {p['formula']}")
    if "rows" in p:
        lines.append(f"   p: {_shape(p['shape'])}, rows of {p['table']} {_shape(p['table_shape'])}")
        for r in _sample_rows(p["rows"]):
            lines.append("   …" if r is None else f"   {r['position']:>4}  {_vec(r['values'])}")
    for name, values in p.get("values", {}).items():
        lines.append(f"   {name}: {values}")
    lines.append(
        f"   h⁽⁰⁾: {_shape(e['shape'])}; ‖h⁽⁰⁾_i‖ last {t.input_norms[-1]:.3f}, "
        f"mean {sum(t.input_norms) / T:.3f}"
    )
    lines.append("")

    lines.append(
        f"4. Transformer blocks: {m['n_layer']} × (attention + feed-forward), {m['norm_placement']}-norm"
    )
    lines.append(
        f"   ‖h⁽ˡ⁾‖ is the residual-stream norm after block l; attention of the last token "
        f"{_quoted(t.tokens[-1]['token'])} (top {TOP_ATTENTION} per head)"
    )
    for layer in t.layers:
        norms = layer["residual_norms"]
        lines.append(
            f"   block {layer['layer']}: ‖h⁽{_sup(layer['layer'] + 1)}⁾‖ last {norms[-1]:.3f}, "
            f"mean {sum(norms) / T:.3f}"
        )
        lines += _head_lines(layer["attention"], "head")
        lines += _head_lines(layer.get("cross_attention", []), "cross")  # over the source tokens
    lines.append("")

    f = t.final
    lines.append(f"5. Final hidden state h_out ({f['where']}): {_shape(f['shape'])}")
    lines.append(f"   last position: ‖h_out‖ {f['norm']:.3f}  {_vec(f['values'])}")
    lines.append("")

    lg = t.logits
    cap = f", soft-capped at {lg['softcap']:g}" if lg["softcap"] else ""
    lines.append(f"6. Logits   z = h_out·W_eᵀ: {_shape(lg['shape'])}{cap}")
    lines.append(
        f"   last position: min {lg['min']:+.3f}, max {lg['max']:+.3f}, mean {lg['mean']:+.3f}, "
        f"std {lg['std']:.3f}"
    )
    lines.append("")

    tau = "τ = 0: greedy, all probability on the arg-max" if t.temperature == 0 else f"τ = {t.temperature:g}"
    lines.append(f"7. Next token   p = softmax(z/τ), {tau}: top {len(t.next_tokens)}")
    nw = max(len(_quoted(x["token"])) for x in t.next_tokens)
    for x in t.next_tokens:
        bar = "█" * round(x["prob"] * 40)
        lines.append(
            f"   {_quoted(x['token']):<{nw}}  id {x['id']:>6}  logit {x['logit']:+8.3f}  "
            f"p {x['prob']:.4f}  {bar}"
        )
    return lines


def _head_lines(heads: list[dict[str, Any]], name: str) -> list[str]:
    return [
        f"      {name} {h['head']:>2}: "
        + "  ".join(f"{_quoted(a['token'])}@{a['position']} {a['weight']:.2f}" for a in h["top"])
        for h in heads
    ]


_SUP = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def _sup(n: int) -> str:
    return str(n).translate(_SUP)


__all__ = ["POSITION_STAGES", "Trace", "logit_stats", "trace"]
