"""Fake machines, as ``gptlab.hardware.detect`` would report them: the CPUs and GPUs the tests of
``device=auto``, ``dtype=auto`` and the compile choices imitate (``monkeypatch.setattr(hardware, "detect",
lambda: AVX2)``)."""

from __future__ import annotations

from gptlab.hardware import Machine

AVX2 = Machine(cpu_capability="AVX2", cpu_flags=frozenset({"avx", "avx2", "fma", "f16c"}))
AVX512_BF16 = Machine(
    cpu_capability="AVX512",
    cpu_flags=frozenset({"avx2", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16"}),
)
AVX512_NO_BF16 = Machine(cpu_capability="AVX512", cpu_flags=frozenset({"avx2", "avx512f", "avx512bw"}))
# an AVX-512-BF16 CPU with torch told to dispatch AVX2 kernels (ATEN_CPU_CAPABILITY=avx2)
AVX512_BF16_AS_AVX2 = Machine(cpu_capability="AVX2", cpu_flags=AVX512_BF16.cpu_flags)
CUDA_BF16 = Machine(
    cpu_capability="AVX2", cpu_flags=AVX2.cpu_flags, cuda_built=True, cuda_devices=1, cuda_bf16=True
)
CUDA_NO_BF16 = Machine(cpu_capability="AVX2", cpu_flags=AVX2.cpu_flags, cuda_built=True, cuda_devices=2)
CUDA_TORCH_NO_GPU = Machine(cpu_capability="AVX2", cpu_flags=AVX2.cpu_flags, cuda_built=True)
APPLE = Machine(cpu_capability="DEFAULT", mps_built=True, mps_available=True)
