"""One FLOPs formula for `gptlab size` and the training loop's MFU, and the peak it is measured against."""

from __future__ import annotations

import pytest

from gptlab import GPTConfig
from gptlab.inspect import size_report
from gptlab.inspect.flops import device_peak, mfu, peak_flops, training_flops_per_token
from gptlab.inspect.params import matmul_params
from gptlab.train.metrics import Progress


@pytest.mark.parametrize("name", ["gpt2", "llama-tiny", "char-tiny"])
def test_training_flops_are_what_size_reports(name):
    config = GPTConfig.preset(name)
    report = size_report(config)
    assert training_flops_per_token(config) == report.value("training") == 3 * report.value("forward")
    N, L, d = matmul_params(config), config.n_layer, config.n_embd
    assert report.value("N (multiplied weights)") == N
    assert training_flops_per_token(config, 128) == 3 * (2 * N + 2 * L * 128 * d)


@pytest.mark.parametrize(
    ("device_name", "dtype", "card", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", "bfloat16", "H100", 989e12),
        ("NVIDIA H200", "bfloat16", "H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", "float16", "A100", 312e12),
        ("NVIDIA A100-SXM4-80GB", "float32", "A100", 19.5e12),
        ("NVIDIA L40S", "bfloat16", "L40S", 362e12),
        ("NVIDIA L40", "bfloat16", "L40", 181e12),
        ("NVIDIA GeForce RTX 4090", "bfloat16", "4090", 165e12),
    ],
)
def test_each_card_is_measured_against_its_own_peak(device_name, dtype, card, peak):
    assert device_peak(device_name, dtype) == (card, peak)


def test_no_peak_and_no_mfu_on_a_cpu_or_an_unknown_card():
    assert peak_flops("cpu", "bfloat16") is None
    assert device_peak("Some Future Accelerator", "bfloat16") is None
    bar = Progress(10, 0, False, tokens_per_step=1000, flops_per_token=6e6, peak=None)
    assert "MFU" not in bar.postfix(2.0, 0.01)
    bar.close()


def test_the_progress_bar_shows_mfu_against_the_peak():
    flops, tokens, dt, peak = 6e9, 4096, 0.05, ("H100", 989e12)
    bar = Progress(10, 0, False, tokens_per_step=tokens, flops_per_token=flops, peak=peak, devices=2)
    expected = 100 * flops * (tokens / dt) / (989e12 * 2)
    assert f"MFU {expected:.1f}%" in bar.postfix(2.0, dt)
    assert mfu(flops, tokens / dt, 989e12, 2) == pytest.approx(expected / 100)
    bar.close()
