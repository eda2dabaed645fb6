"""Inside, under a grammar: at every step of a reply, which tokens a JSON schema or a regex allowed.

A reply ``y = (y_0, …, y_{n−1})`` follows a prompt ``x``. One forward pass over ``x + y`` gives the
logits ``z_t`` the model had before each token ``y_t`` (row ``|x| + t − 1``). At each step the
grammar's matcher (``gptlab.generate.grammar.Constraint``, the one the sampler uses), advanced past
``y_<t``, gives the set ``A_t`` of tokens allowed next, and the view reads, at temperature 1:

    p_i        = softmax(z_t)_i                             the model's own, unconstrained
    mass_t     = Σ_{i ∈ A_t} p_i                           the share of it the grammar kept
    p'_i       = p_i / mass_t  (i ∈ A_t),  0 otherwise      what a sampler draws from under the mask
    overruled  = argmax_i p_i ∉ A_t                         the model's own choice was forbidden
    forced     = |A_t| = 1                                  the grammar wrote this token, not the model

(``p'`` is ``softmax`` of the masked logits ``l'`` of ``generate/grammar.py``.) Stop tokens (end of
text, end of turn) are in ``A_t`` exactly where the text so far is a complete string of the language.
A given reply may leave the language: the first token the grammar refuses ends the walk there
(``rejected_at``). After the last token one more step shows what could come next, unless the reply
ended on a stop token or the grammar admits nothing more (``complete``). A step where no token of this
vocabulary can go on (a character the language needs is missing) has ``allowed = 0`` and ends the walk.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from gptlab.errors import GptlabError
from gptlab.generate import SampleConfig
from gptlab.generate.grammar import Constraint
from gptlab.generate.request import stop_token_ids, vocab_size
from gptlab.inspect.inputs import token_ids, token_label
from gptlab.model import GPT
from gptlab.tokenizers.chat import stop_ids

MAX_TOP = 50  # allowed tokens and model tokens listed per step, at most


def constraint_config(
    json_schema: dict[str, Any] | None = None, regex: str | None = None, grammar: str | None = None
) -> SampleConfig:
    """The ``SampleConfig`` of one constraint (exactly one given), with the tokenizer-independent
    fields left at their defaults; ``GptlabError`` when none or several are given."""
    given = [
        n for n, v in (("json_schema", json_schema), ("regex", regex), ("grammar", grammar)) if v is not None
    ]
    if len(given) != 1:
        raise GptlabError(
            f"give exactly one of json_schema, regex and grammar, got {', '.join(given) or 'none'}"
        )
    return SampleConfig(json_schema=json_schema, regex=regex, grammar=grammar)


def reply_stops(config: SampleConfig, tokenizer: Any) -> frozenset[int]:
    """The ids that end a reply, as the server's sampler has them: end of text and end of turn."""
    return stop_token_ids(config, tokenizer) | frozenset(stop_ids(tokenizer))


def _first_line(message: str) -> str:
    """An engine message without the parser state it appends (``<state>…``, ``: NoExtensionBias``)."""
    return message.split("\n")[0].split(": NoExtension")[0].split("<state>")[0].strip()


def _entry(tokenizer: Any, i: int, **data: Any) -> dict[str, Any]:
    return {"id": i, "token": token_label(tokenizer, i), **data}


def _p(logp: torch.Tensor, i: int) -> float:
    value = float(logp[i])
    return math.exp(value) if value > -math.inf else 0.0


@torch.no_grad()
def step_logits(model: GPT, ids: Sequence[int]) -> torch.Tensor:
    """``z`` (T, V) float32 of one pass over ``ids`` (eval mode, restored after)."""
    if model.config.arch != "decoder":
        raise GptlabError(
            f"the grammar view reads a decoder's reply; this model is an {model.config.arch} "
            "(its replies are not written token by token after the text)"
        )
    was_training = model.training
    model.eval()
    try:
        out = model.run(torch.tensor([list(ids)], dtype=torch.long, device=model.device))
    finally:
        model.train(was_training)
    assert out.logits is not None
    return out.logits[0].float().cpu()


def grammar_steps(
    model: GPT,
    tokenizer: Any,
    prompt: str | Sequence[int],
    reply: str | Sequence[int],
    config: SampleConfig,
    top: int = 10,
) -> dict[str, Any]:
    """Walk ``reply`` (after ``prompt``) through ``config``'s grammar → the steps described above, JSON-ready.

    ``top`` allowed tokens (by ``p``) and model tokens (unconstrained) per step, 1..``MAX_TOP``.
    """
    if not isinstance(top, int) or not 1 <= top <= MAX_TOP:
        raise GptlabError(f"top must be an integer in 1..{MAX_TOP}, got {top!r}")
    if not config.constrained:
        raise GptlabError("no json_schema, regex or grammar is set: nothing to show")
    x = token_ids(model, tokenizer, prompt) if isinstance(prompt, str) else list(prompt)
    y = (list(tokenizer.encode_ordinary(reply)) if reply else []) if isinstance(reply, str) else list(reply)
    if not x:
        raise GptlabError("the prompt is empty: the reply's first token needs a token before it")
    V = vocab_size(model, tokenizer)
    stops = reply_stops(config, tokenizer)
    constraint = Constraint(config, tokenizer, V, stops)
    logits = step_logits(model, x + y)
    steps: list[dict[str, Any]] = []
    rejected_at: int | None = None
    for t in range(len(y) + 1):
        row = len(x) + t - 1
        z = logits[row]
        logp = torch.log_softmax(z, dim=-1)
        choosable = logp[:V]
        best = int(choosable.argmax())
        step: dict[str, Any] = {
            "step": t,
            "position": row + 1,  # where the token of this step goes in prompt + reply
            "read_at": row,  # the row of logits it is drawn from
            "accepting": constraint.accepting,
            "complete": constraint.done,
        }
        token = y[t] if t < len(y) else None
        if constraint.done:  # nothing may follow: the reply ends here, without a draw
            steps.append(
                {**step, "allowed": 0, "allowed_mass": 0.0, "forced": False, "overruled": False,
                 "model_choice": _entry(tokenizer, best, p=_p(logp, best), allowed=False),
                 "top_allowed": [], "top_model": [_entry(tokenizer, i, p=_p(logp, i), allowed=False)
                                                  for i in choosable.topk(min(top, V)).indices.tolist()],
                 "token": None if token is None else _entry(tokenizer, token, p=_p(logp, token), allowed=False),
                 "note": "the text is complete and the grammar admits nothing more: the reply ends here"}
            )  # fmt: skip
            if token is not None:
                rejected_at = t
            break
        try:
            mask = constraint.allowed().clone()
            note = None
        except GptlabError as exc:  # no token of this vocabulary continues the text
            mask = torch.zeros(V, dtype=torch.bool)
            note = _first_line(str(exc))
        count = int(mask.sum())
        masked = torch.log_softmax(choosable.masked_fill(~mask, -math.inf), dim=-1) if count else None
        mass = float(torch.logsumexp(choosable[mask], dim=0).exp()) if count else 0.0
        top_model = choosable.topk(min(top, V)).indices.tolist()
        top_allowed = masked.topk(min(top, count)).indices.tolist() if masked is not None else []
        step.update(
            allowed=count,
            allowed_mass=mass,
            forced=count == 1,
            overruled=count > 0 and not bool(mask[best]),
            model_choice=_entry(tokenizer, best, p=_p(logp, best), allowed=bool(mask[best])),
            top_allowed=[
                _entry(tokenizer, i, p=_p(logp, i), p_masked=_p(masked, i), stop=i in stops)  # type: ignore[arg-type]
                for i in top_allowed
            ],
            top_model=[_entry(tokenizer, i, p=_p(logp, i), allowed=bool(mask[i])) for i in top_model],
        )
        if note is not None:
            step["note"] = note
        if token is None:
            step["token"] = None
            steps.append(step)
            break
        ok = 0 <= token < V and bool(mask[token])
        step["token"] = _entry(
            tokenizer,
            token,
            p=_p(logp, token),
            p_masked=_p(masked, token) if ok and masked is not None else 0.0,
            allowed=ok,
            stop=token in stops,
            rank=int((choosable > choosable[token]).sum()) + 1 if 0 <= token < V else None,
        )
        steps.append(step)
        if not ok:
            rejected_at = t
            break
        if token in stops:  # the reply ends on it (allowed: the text was complete)
            break
        try:
            constraint.consume(token)
        except GptlabError as exc:  # the engine's mask let it through, its parser does not: refused
            step["token"].update(allowed=False, p_masked=0.0)
            step["note"] = _first_line(str(exc))
            rejected_at = t
            break
    labelled = [_entry(tokenizer, i, position=k) for k, i in enumerate(x)]
    return {
        "constraint": constraint.what,
        "vocab_size": V,
        "stop_tokens": [_entry(tokenizer, i) for i in sorted(stops) if i < V],
        "prompt_tokens": labelled,
        "tokens": [_entry(tokenizer, i, step=t, position=len(x) + t) for t, i in enumerate(y)],
        "steps": steps,
        "rejected_at": rejected_at,
        "summary": {
            "steps": len(steps),
            "overruled": [s["step"] for s in steps if s["overruled"]],
            "forced": sum(1 for s in steps if s["forced"]),
            "mean_allowed_mass": (sum(s["allowed_mass"] for s in steps) / len(steps)) if steps else 0.0,
        },
    }


__all__ = ["MAX_TOP", "constraint_config", "grammar_steps", "reply_stops", "step_logits"]
