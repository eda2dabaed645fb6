"""gptlab.train.muon: Muon's Newton–Schulz in float32 where bf16 is emulated, identical to torch's in bf16."""

from __future__ import annotations

import pytest
import torch

from gptlab import hardware
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


def test_the_muon_is_chosen_per_machine(monkeypatch):
    from test_hardware import AVX2, AVX512_BF16

    monkeypatch.setattr(hardware, "detect", lambda: AVX2)
    assert muon_class("cpu") is Float32Muon
    monkeypatch.setattr(hardware, "detect", lambda: AVX512_BF16)
    assert muon_class("cpu") is torch.optim.Muon
