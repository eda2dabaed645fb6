"""One recorded forward pass: what every inspection (trace, attention maps, logit lens, Inside) reads.

The pass runs once in eval mode through the plain attention path (``output_attentions=True``),
so the weights recorded are the ones the model used:

    h⁽⁰⁾ = e_x + p                                  the input of the blocks      (T, d_model)
    a⁽ˡ⁾ = MultiHead(LN(h))                         attention's contribution     (T, d_model)
    f⁽ˡ⁾ = FFN(LN(h'))                              the feed-forward's           (T, d_model)
    h⁽ˡ⁾ = Block_l(h⁽ˡ⁻¹⁾)                           the residual stream after block l
    A⁽ˡ⁾ = softmax(Q·Kᵀ/√d_k + M)                   per layer and head           (H, T_q, T_k)
    z    = head(norm(h⁽ᴺ⁾))                          the logits                   (T, V)

The sublayer outputs (``a``, ``f`` and, in an encoder–decoder, the cross-attention's ``c``) are
what each sublayer adds to the residual stream (pre-norm) or adds before the norm (post-norm);
they are read with forward hooks, so the model runs unchanged.

An encoder–decoder reads ``text`` as its source; its decoder reads BOS + ``target``
(``model_input``), and the recording also holds the encoder's and the cross-attention weights.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from gptlab.inspect.inputs import token_ids, token_labels
from gptlab.model import GPT

if TYPE_CHECKING:
    from gptlab.tokenizers.base import Tokenizer

#: The sublayers whose outputs a recording keeps, by name → the block's attribute.
SUBLAYERS = {"attention": "attn", "cross_attention": "cross_attn", "feed_forward": "mlp"}


@dataclass
class ModelInput:
    """The ids the model reads, with their labels; an encoder–decoder also has a source."""

    ids: list[int]
    labels: list[str]
    source: list[int] | None = None
    source_labels: list[str] = field(default_factory=list)


def model_input(
    model: GPT,
    tokenizer: Tokenizer | None,
    text: str | Sequence[int] | torch.Tensor,
    target: str | None = None,
) -> ModelInput:
    """``text`` (or ids) as the model reads it; for an encoder–decoder, the source, and BOS + ``target``."""
    ids = token_ids(model, tokenizer, text)
    labels = token_labels(tokenizer, ids)
    if model.config.arch != "encoder-decoder":
        return ModelInput(ids, labels)
    bos = getattr(tokenizer, "eot_id", None) or 0
    tgt = [bos, *(token_ids(model, tokenizer, target) if target else [])]
    return ModelInput(tgt, token_labels(tokenizer, tgt), ids, labels)


@dataclass
class Recording:
    """Everything one forward pass reports, batch dimension dropped, on the CPU."""

    logits: torch.Tensor  # (T, V) float32
    hidden: list[torch.Tensor]  # L + 1 residual streams (T, d_model): h⁽⁰⁾ … h⁽ᴺ⁾, the model's dtype
    attentions: dict[str, torch.Tensor]  # "self" (L, H, T, T); "cross" (L, H, T, S); "encoder" (L_e, H, S, S)
    sublayers: dict[str, list[torch.Tensor]]  # SUBLAYERS name → per layer (T, d_model); empty if not asked
    embeddings: torch.Tensor  # e_i = W_e[x_i]: (T, d_model)
    final: torch.Tensor  # norm(h⁽ᴺ⁾): (T, d_model), what the head reads


@torch.no_grad()
def record(model: GPT, inp: ModelInput, sublayers: bool = False) -> Recording:
    """Run ``inp`` through ``model`` once (eval mode, restored after) and keep every stage.

    The head runs on every position: on one row, an inference layer may take the compiled
    one-row decode path (``gptlab.model.quantized``), which compiles on its first call.
    """
    captured: dict[str, list[torch.Tensor]] = {}
    handles = []
    if sublayers:
        for name, attr in SUBLAYERS.items():
            modules = [getattr(b, attr) for b in model.blocks if hasattr(b, attr)]
            if modules:
                captured[name] = []
                handles += [m.register_forward_hook(_keeper(captured[name])) for m in modules]
    extra: dict[str, Any] = (
        {} if inp.source is None else {"source": torch.tensor([inp.source], device=model.device)}
    )
    was_training = model.training
    model.eval()
    try:
        idx = torch.tensor([inp.ids], dtype=torch.long, device=model.device)
        out = model.run(idx, output_attentions=True, output_hidden_states=True, **extra)
        embeddings = model.wte(idx)[0]
        hidden = [h[0].cpu() for h in out.hidden_states or []]
        final = model.norm_f(out.hidden_states[-1])[0]  # type: ignore[index]
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    kinds = {"self": out.attentions, "cross": out.cross_attentions, "encoder": out.encoder_attentions}
    assert out.logits is not None
    return Recording(
        logits=out.logits[0].float().cpu(),
        hidden=hidden,
        attentions={k: torch.stack([a[0].float() for a in v]).cpu() for k, v in kinds.items() if v},
        sublayers=captured,
        embeddings=embeddings.cpu(),
        final=final.cpu(),
    )


def _keeper(into: list[torch.Tensor]) -> Any:
    """A forward hook appending the sublayer's output ``(1, T, d)`` (or its first element) as ``(T, d)``."""

    def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
        y = output[0] if isinstance(output, tuple) else output
        into.append(y[0].detach().cpu())

    return hook


__all__ = ["SUBLAYERS", "ModelInput", "Recording", "model_input", "record"]
