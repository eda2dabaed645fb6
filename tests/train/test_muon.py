"""gptlab.train.muon: Muon's Newton–Schulz in float32 where bf16 is emulated, identical to torch's in bf16."""

from __future__ import annotations

import pytest
import torch

from gptlab import hardware
from gptlab.train import muon
from gptlab.train.muon import Float32Muon, muon_class, newton_schulz

COEFFS = (3.4445, -4.7750, 2.0315)


@pytest.mark.parametrize("shape", [(96, 32), (32, 96)])
def test_newton_schulz_in_bf16_is_torchs_iteration(shape):
    from torch.optim._muon import _zeropower_via_newtonschulz

    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    ours = newton_schulz(g, COEFFS, 5, 1e-7, torch.bfloat16)
    assert torch.equal(ours, _zeropower_via_newtonschulz(g, COEFFS, 5, 1e-7))
    f32 = newton_schulz(g, COEFFS, 5, 1e-7)
    assert f32.dtype == torch.float32 and f32.shape == g.shape
    # the same orthogonalisation up to bf16's rounding; singular values pushed into ~[0.5, 1.5]
    assert (f32 - ours.float()).abs().max() < 0.05
    s = torch.linalg.svdvals(f32)
    assert s.min() > 0.4 and s.max() < 1.6


def _steps(cls, n=3):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(48, 16)), torch.nn.Parameter(torch.randn(16, 40))]
    opt = cls(params, lr=0.02, momentum=0.95, weight_decay=0.01, adjust_lr_fn="original")
    gen = torch.Generator().manual_seed(1)
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=gen)
        opt.step()
    return params, opt


def test_float32_muon_is_torchs_muon_with_float32_newton_schulz():
    class BF16(Float32Muon):
        ns_dtype = torch.bfloat16

    ref, ref_opt = _steps(torch.optim.Muon)
    same, _ = _steps(BF16)
    assert all(torch.equal(a, b) for a, b in zip(ref, same, strict=True))  # the update rule, bit for bit
    f32, f32_opt = _steps(Float32Muon)
    for a, b in zip(ref, f32, strict=True):
        assert not torch.equal(a, b)  # really another precision
        torch.testing.assert_close(a, b, atol=3e-3, rtol=0)
    # the same state: a checkpoint resumes under either
    f32_opt.load_state_dict(ref_opt.state_dict())
    assert f32_opt.state_dict()["state"][0]["momentum_buffer"].equal(
        ref_opt.state_dict()["state"][0]["momentum_buffer"]
    )


@pytest.mark.parametrize("shape", [(40, 24), (24, 40)])
def test_newton_schulz_of_a_stack_is_each_matrixs(shape):
    g = torch.randn(3, *shape, generator=torch.Generator().manual_seed(2))
    g[1] *= 50.0  # each matrix is scaled by its own norm
    stacked = newton_schulz(g, COEFFS, 5, 1e-7)
    assert stacked.shape == g.shape
    for k in range(3):
        torch.testing.assert_close(stacked[k], newton_schulz(g[k], COEFFS, 5, 1e-7), atol=1e-5, rtol=0)


def test_float32_muon_batches_same_shaped_matrices_and_keeps_the_update(monkeypatch):
    """Same-shaped matrices go through one stacked NS; the parameters match matrix-by-matrix NS."""
    shapes = [(48, 16), (16, 40), (48, 16), (16, 16), (48, 16), (16, 40)]

    def run(batched: bool):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
        opt = Float32Muon(params, lr=0.02, momentum=0.95, weight_decay=0.01, adjust_lr_fn="original")
        seen = []
        real = muon.newton_schulz

        def spy(u, *args):  # type: ignore[no-untyped-def]
            seen.append(tuple(u.shape))
            return real(u, *args)

        monkeypatch.setattr(
            muon, "same_shapes", muon.same_shapes if batched else lambda ts: [[i] for i in range(len(ts))]
        )
        monkeypatch.setattr(muon, "newton_schulz", spy)
        gen = torch.Generator().manual_seed(1)
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            opt.step()
        return params, seen

    batched, seen = run(True)
    assert seen[:3] == [(3, 48, 16), (2, 16, 40), (16, 16)]  # 3 stacks for 6 matrices
    single, seen = run(False)
    assert len(seen) == 18
    for a, b in zip(batched, single, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_the_muon_is_chosen_per_machine(monkeypatch):
    from tests._machines import AVX2, AVX512_BF16

    monkeypatch.setattr(hardware, "detect", lambda: AVX2)
    assert muon_class("cpu") is Float32Muon
    monkeypatch.setattr(hardware, "detect", lambda: AVX512_BF16)
    assert muon_class("cpu") is torch.optim.Muon
