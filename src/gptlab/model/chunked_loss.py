"""The output head and its cross-entropy fused and taken over chunks of rows, so the logits
``(N, V_pad)`` of a whole batch are never held at once.

For rows ``h_i`` (N, d_model) of the last hidden state, the head ``W`` (V_pad, d_model), targets
``y_i`` (−1: no loss) and ``n = |{i : y_i ≠ −1}|``:

    z_i   = h_i·Wᵀ                       (soft-capped: z ← c·tanh(z/c); columns ≥ V set to −∞)
    L     = (1/n)·Σ_{y_i ≠ −1} (logsumexp(z_i) − z_i[y_i])
    ∂L/∂z_i = (softmax(z_i) − onehot(y_i))/n      (0 for an ignored row; 0 in the padded columns)
    ∂L/∂h_i = (∂L/∂z_i)·W,   ∂L/∂W = Σ_i (∂L/∂z_i)ᵀ·h_i

``ChunkedHeadLoss`` walks the rows ``chunk_rows`` at a time: per chunk it forms the logits in
the matrix-product dtype (autocast's, or the inputs'), takes the softmax and loss in float32,
and derives the chunk's ``∂L/∂h`` and its share of ``∂L/∂W`` right away (as Liger-Kernel's
fused linear cross-entropy does). Only ``∂L/∂h`` (N, d) and ``∂L/∂W`` (V_pad, d) are kept for
the backward, which scales them by the incoming gradient; the peak extra memory is one
chunk's logits, ``chunk_rows·V_pad`` floats, instead of several ``N·V_pad`` tensors. The same
three matrix products as the plain path are done, and no value is read on the host.
"""

from __future__ import annotations

from typing import Any

import torch

CHUNK_ROWS = 1024  # rows per chunk: 1024 × 50,304 float32 logits = 206 MB, a GPU-sized matrix product


def compute_dtype(x: torch.Tensor) -> torch.dtype:
    """The dtype the head's matrix product runs in: autocast's where it is on, else ``x``'s."""
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return x.dtype


def _chunk(
    h: torch.Tensor,  # (C, d) in the product dtype
    w: torch.Tensor,  # (V_pad, d) in the product dtype
    y: torch.Tensor,  # (C,) targets, −1 ignored
    vocab_size: int,
    softcap: float | None,
    inv_n: torch.Tensor,  # () 1/n, float32
    want_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(Σ of the chunk's row losses, float32; ∂L/∂z of its rows (C, V_pad) or None)."""
    z = (h @ w.t()).float()  # (C, V_pad); every step below works in place on this one buffer
    t = None
    if softcap is not None:
        t = z.div_(softcap).tanh_()
        z = t * softcap
    if z.size(1) > vocab_size:
        z[:, vocab_size:] = float("-inf")  # the padding columns are never a token
    keep = y != -1  # (C,)
    safe = torch.where(keep, y, torch.zeros_like(y))
    picked = z.gather(1, safe[:, None]).squeeze(1)  # z_i[y_i]
    top = z.amax(dim=1, keepdim=True)  # (C, 1)
    e = z.sub_(top).exp_()  # exp(z − max)
    total = e.sum(dim=1, keepdim=True)
    lse = (top + total.log()).squeeze(1)  # logsumexp(z_i)
    loss = torch.where(keep, lse - picked, torch.zeros_like(lse)).sum()
    if not want_grad:
        return loss, None
    g = e.div_(total)  # softmax: (C, V_pad)
    g.scatter_add_(1, safe[:, None], -torch.ones_like(lse[:, None]))
    g.mul_((keep.float() * inv_n)[:, None])  # ignored rows: 0
    if t is not None:  # d(c·tanh(u/c))/du = 1 − tanh²
        g.mul_(t.square_().neg_().add_(1))
    return loss, g


def _accumulate(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    """``out += a·b`` into the float32 ``out`` (a bf16/fp16 product is rounded once, then added)."""
    if a.dtype == out.dtype:
        out.addmm_(a, b)
    else:
        out.add_((a @ b).float())


class ChunkedHeadLoss(torch.autograd.Function):
    """``L(h, W)`` of the module docstring, chunk by chunk; gradients for ``h`` and ``W``."""

    @staticmethod
    def forward(
        ctx: Any,
        h: torch.Tensor,  # (N, d)
        weight: torch.Tensor,  # (V_pad, d)
        targets: torch.Tensor,  # (N,)
        vocab_size: int,
        softcap: float | None,
        chunk_rows: int,
        dtype: torch.dtype,
        want_h: bool,  # derive ∂L/∂h
        want_w: bool,  # derive ∂L/∂W (not for a frozen head)
    ) -> torch.Tensor:
        with torch.autocast(h.device.type, enabled=False):
            hc, wc = h.to(dtype), weight.to(dtype)
            inv_n = 1.0 / (targets != -1).sum().float()  # a tensor: n is never read on the host
            total = torch.zeros((), dtype=torch.float32, device=h.device)
            want_grad = want_h or want_w
            grad_h = torch.empty_like(h) if want_h else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_w else None
            for start in range(0, h.size(0), chunk_rows):
                rows = slice(start, start + chunk_rows)
                loss, g = _chunk(hc[rows], wc, targets[rows], vocab_size, softcap, inv_n, want_grad)
                total = total + loss
                if g is not None:
                    gc = g.to(dtype)
                    if grad_h is not None:
                        grad_h[rows] = gc @ wc  # (C, d)
                    if grad_w is not None:
                        _accumulate(grad_w, gc.t(), hc[rows])
        if want_grad:
            ctx.save_for_backward(grad_h, grad_w)
        ctx.weight_dtype = weight.dtype
        return total * inv_n

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        grad_h, grad_w = ctx.saved_tensors  # scaled in place: no second (V_pad, d) buffer
        # (a second backward through the same graph would fail autograd's version check, not go wrong)
        return (
            None if grad_h is None else grad_h.mul_(grad_out.to(grad_h.dtype)),
            None if grad_w is None else grad_w.mul_(grad_out).to(ctx.weight_dtype),
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )


def chunked_cross_entropy(
    h: torch.Tensor,  # (..., d) the last hidden state (after the final norm)
    weight: torch.Tensor,  # (V_pad, d) the head
    targets: torch.Tensor,  # (...,) −1 is ignored
    vocab_size: int,
    softcap: float | None = None,
    chunk_rows: int = CHUNK_ROWS,
) -> torch.Tensor:
    """Mean cross-entropy of ``softmax(h·Wᵀ)`` against ``targets``, equal to the plain path's
    (``gptlab.model.loss.next_token_loss``) without forming the logits of all rows at once."""
    h2 = h.reshape(-1, h.size(-1))
    y = targets.reshape(-1)
    grad = torch.is_grad_enabled()
    want_h, want_w = grad and h.requires_grad, grad and weight.requires_grad
    loss: torch.Tensor = ChunkedHeadLoss.apply(  # type: ignore[no-untyped-call]  # torch: Function.apply is untyped
        h2, weight, y, vocab_size, softcap, chunk_rows, compute_dtype(h), want_h, want_w
    )
    return loss
