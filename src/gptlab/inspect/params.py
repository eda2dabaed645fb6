"""Parameter counts of a ``GPTConfig``, each with its formula (blueprint "Parameter Analysis").

    embeddings    V·d                          (the head reuses W_e when tied, eq. 9)
    attention     L·((2 + 2·H_kv/H)·d² + biases)   = L·4·d² for multi-head attention
    feed-forward  L·(2·d·d_ff + biases)        = L·8·d² at d_ff = 4d;  gated: L·3·d·d_ff
    norms         γ (and β) of each LayerNorm / RMSNorm

``N``, the weights a token multiplies (what FLOPs count), is the blocks (active experts only),
the norms and the head ``V·d`` even when tied; the embedding lookup and positions cost no FLOPs.
An encoder–decoder splits it by the tokens that multiply them: ``N_enc`` per source token (the
encoder blocks and final norm, and every decoder layer's cross-attention ``W_K, W_V``, which read
the encoder output) and ``N_dec = N − N_enc`` per target token.
"""

from __future__ import annotations

from gptlab.inspect.figures import Figure
from gptlab.model.config import GATED_MLPS, GPTConfig
from gptlab.model.mlp import ffn_param_count


def _attention_layer(c: GPTConfig) -> tuple[int, str, str]:
    """One layer's W_Q, W_K, W_V, W_O (+ biases): ``(2 + 2·H_kv/H)·d²``."""
    d, h, hkv, dk = c.n_embd, c.n_head, c.n_kv_head, c.head_dim
    assert hkv is not None
    mats = d * (h + 2 * hkv) * dk + h * dk * d
    biases = ((h + 2 * hkv) * dk + d) if c.bias else 0
    if hkv == h:
        formula, calc = "4·d²", f"4·{d}²"
    else:
        formula, calc = "(2 + 2·H_kv/H)·d²", f"(2 + 2·{hkv}/{h})·{d}²"
    if c.bias:
        formula += " + (d + 2·H_kv·d_k) + d" if hkv != h else " + 4·d"
        calc += f" + ({d} + 2·{hkv}·{dk}) + {d}" if hkv != h else f" + 4·{d}"
    return mats + biases, formula, calc


def _ffn_layer(c: GPTConfig) -> tuple[int, int, str, str]:
    """One layer's feed-forward: ``(total, active per token, formula, calc)``."""
    assert c.d_ff is not None
    d, ff = c.n_embd, c.d_ff
    gated = c.mlp in GATED_MLPS
    one = ffn_param_count(d, ff, gated, c.bias)
    if gated:
        formula, calc = "3·d·d_ff", f"3·{d}·{ff}"
        if c.bias:
            formula, calc = formula + " + 2·d_ff + d", calc + f" + 2·{ff} + {d}"
    elif ff == 4 * d:
        formula, calc = "8·d²", f"8·{d}²"
        if c.bias:
            formula, calc = formula + " + 5·d", calc + f" + 5·{d}"
    else:
        formula, calc = "2·d·d_ff", f"2·{d}·{ff}"
        if c.bias:
            formula, calc = formula + " + d_ff + d", calc + f" + {ff} + {d}"
    if c.n_experts:
        e, k = c.n_experts, c.experts_top_k
        return (e * one + d * e, k * one + d * e, f"E·({formula}) + d·E", f"{e}·({calc}) + {d}·{e}")
    return one, one, formula, calc


def _cross_kv_layer(c: GPTConfig) -> int:
    """One decoder layer's cross-attention ``W_K, W_V`` (+ biases, + the key's QK-norm): ``2·d·H_kv·d_k``."""
    assert c.n_kv_head is not None
    kv = 2 * c.n_kv_head * c.head_dim
    return c.n_embd * kv + (kv if c.bias else 0) + (c.head_dim if c.qk_norm else 0)


def _norm_size(c: GPTConfig) -> tuple[int, str]:
    """γ (and β for a LayerNorm with bias) of one norm over d_model."""
    if c.norm == "layernorm" and c.bias:
        return 2 * c.n_embd, "2·d"
    return c.n_embd, "d"


def parameter_figures(c: GPTConfig) -> tuple[list[Figure], dict[str, int]]:
    V, d, L, T_max = c.vocab_size, c.n_embd, c.n_layer, c.block_size
    # an encoder–decoder adds L_enc encoder blocks, L cross-attention sublayers (each the size of a
    # self-attention: W_Q, W_K, W_V, W_O) with their norms, a second position table and a final norm
    E = c.n_encoder_layer or 0
    X = L if E else 0
    stacks = "(L + L_enc + L_cross)·" if E else "L·"
    n_att, n_ffn = L + E + X, L + E
    figs: list[Figure] = []
    emb = V * d
    figs.append(
        Figure(
            "embeddings",
            emb,
            "params",
            "V·d",
            f"{V}·{d}",
            "W_e, shared with the output head (eq. 9)" if c.tie_embeddings else "W_e",
        )
    )
    pos = (2 if E else 1) * T_max * d if c.pos == "learned" else 0
    pos_notes = {
        "learned": ("2·T_max·d", f"2·{T_max}·{d}", "W_p of encoder and decoder")
        if E
        else ("T_max·d", f"{T_max}·{d}", "the learned table W_p"),
        "sinusoidal": ("0", "", "a fixed sin/cos table: a buffer, not a parameter"),
        "rope": ("0", "", "rotary angles are computed, not learned"),
        "alibi": ("0", "", "ALiBi slopes are fixed"),
        "none": ("0", "", "no position encoding"),
    }
    formula, calc, note = pos_notes[c.pos]
    figs.append(Figure("positions", pos, "params", formula, calc, note))

    att, a_formula, a_calc = _attention_layer(c)
    figs.append(
        Figure(
            "attention",
            n_att * att,
            "params",
            f"{stacks}({a_formula})",
            f"{n_att}·({a_calc})",
            f"{att:,} per layer" + (", cross-attention included" if E else ""),
        )
    )
    ffn, ffn_active, f_formula, f_calc = _ffn_layer(c)
    figs.append(
        Figure(
            "feed_forward",
            n_ffn * ffn,
            "params",
            f"{'(L + L_enc)' if E else 'L'}·({f_formula})",
            f"{n_ffn}·({f_calc})",
            f"{ffn:,} per layer"
            + (f"; {ffn_active:,} active per token (k={c.experts_top_k})" if c.n_experts else ""),
        )
    )

    one_norm, n_formula = _norm_size(c)
    n_final = 1 if c.norm_placement == "pre" else 0
    qk = 2 * c.head_dim if c.qk_norm else 0
    n_norms = 2 * L + n_final + (2 * E + X + n_final if E else 0)
    norms = n_norms * one_norm + n_att * qk
    if E:
        formula = f"(3·L + 2·L_enc{' + 2' if n_final else ''})·{n_formula}"
        calc = f"{n_norms}·{n_formula.replace('d', str(c.n_embd))}"
    else:
        formula = f"(2·L{' + 1' if n_final else ''})·{n_formula}"
        calc = f"(2·{L}{' + 1' if n_final else ''})·{n_formula.replace('d', str(c.n_embd))}"
    if qk:
        formula, calc = formula + f" + {stacks}2·d_k", calc + f" + {n_att}·2·{c.head_dim}"
    figs.append(
        Figure(
            "norms",
            norms,
            "params",
            formula,
            calc,
            ("three per decoder block, two per encoder block" if E else "two per block")
            + ((", a final one per stack" if E else ", one final") if n_final else "")
            + (", QK-norm" if qk else ""),
        )
    )

    head = 0 if c.tie_embeddings else V * d
    figs.append(
        Figure(
            "head",
            head,
            "params",
            "0 (tied)" if c.tie_embeddings else "V·d",
            "" if c.tie_embeddings else f"{V}·{d}",
            "logits = h·W_eᵀ reuse W_e" if c.tie_embeddings else "a separate W_out",
        )
    )
    total = emb + pos + n_att * att + n_ffn * ffn + norms + head
    figs.append(Figure("total", total, "params", "sum of the above"))
    figs.append(Figure("total_without_positions", total - pos, "params", "total − positions"))
    active = emb + n_att * att + n_ffn * ffn_active + norms + head
    if c.n_experts:
        figs.append(
            Figure(
                "active_per_token",
                active,
                "params",
                "total − positions − L·(E − k)·FFN",
                note="weights one token uses",
            )
        )
    # weights a token multiplies: blocks (active experts), norms, and the head V·d (even when tied);
    # the embedding lookup and the position table cost no multiply-adds
    matmul = n_att * att + n_ffn * ffn_active + norms + V * d
    # per source token (encoder–decoder): the encoder stack, its final norm and the cross-attention K/V
    source = E * (att + ffn_active + 2 * one_norm + qk) + (
        n_final * one_norm + L * _cross_kv_layer(c) if E else 0
    )
    return figs, {"total": total, "matmul": matmul, "matmul_source": source, "positions": pos}


def matmul_params(config: GPTConfig) -> int:
    """``N``: the weights one token multiplies (blocks with k active experts, norms, the head ``V·d``)."""
    return parameter_figures(config)[1]["matmul"]


def source_matmul_params(config: GPTConfig) -> int:
    """``N_enc``: of ``N``, the weights a *source* token multiplies (0 unless ``arch="encoder-decoder"``)."""
    return parameter_figures(config)[1]["matmul_source"]
