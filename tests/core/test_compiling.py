"""gptlab.compiling: the compiled path is the one that runs, and a broken compile is noticed."""

from __future__ import annotations

import pytest
import torch

from gptlab import compiling
from gptlab.compiling import Compiled, can_compile


def _poly(x: torch.Tensor) -> torch.Tensor:
    return x * x + 2 * x + 1


@pytest.mark.slow  # a cold inductor compile: ~20 s on 2 busy cores
@pytest.mark.skipif(not can_compile("cpu"), reason="no C++ compiler for torch.compile")
def test_a_compiled_function_runs_compiled(monkeypatch):
    fn = Compiled(_poly, "a test polynomial")
    x = torch.arange(5.0)
    assert torch.equal(fn(x), _poly(x))
    assert torch.equal(fn(x), _poly(x))
    assert fn.enabled and fn.failure is None and fn.compiled_calls == 2


def _broken(monkeypatch) -> Compiled:
    """A Compiled whose torch.compile produces a function that fails, as a broken toolchain does."""

    def broken_compile(fn, **kwargs):
        def run(*args):
            raise RuntimeError("inductor: no such header <Python.h>")

        return run

    monkeypatch.setattr(compiling, "can_compile", lambda device_type: True)
    monkeypatch.setattr(torch, "compile", broken_compile)
    return Compiled(_poly, "a test polynomial")


def test_a_broken_compile_falls_back_to_eager_and_says_so(monkeypatch):
    fn = _broken(monkeypatch)
    x = torch.arange(5.0)
    with pytest.warns(UserWarning, match="a test polynomial: torch.compile failed .*Python.h"):
        assert torch.equal(fn(x), _poly(x))  # still the right answer, from the eager function
    assert not fn.enabled and isinstance(fn.failure, RuntimeError) and fn.compiled_calls == 0
    assert torch.equal(fn(x), _poly(x))  # later calls go straight to eager, without a warning


def test_a_broken_compile_fails_any_test_it_happens_in(monkeypatch):
    """pyproject.toml turns the fallback's warning into an error: no compiled test passes on eager."""
    fn = _broken(monkeypatch)
    with pytest.raises(UserWarning, match="torch.compile failed"):
        fn(torch.arange(5.0))


def test_compiling_switched_off_runs_eagerly_even_for_a_kernel_built_before(monkeypatch):
    fn = _broken(monkeypatch)  # were it called compiled, it would raise
    assert fn.enabled
    previous = compiling.configure(compile=False)
    try:
        assert not fn.enabled and compiling.compile_blocker("cuda") is not None
        assert "switched off" in (compiling.compile_blocker("cpu") or "")
        assert torch.equal(fn(torch.arange(5.0)), _poly(torch.arange(5.0)))  # eager: no warning, no error
        assert fn.compiled_calls == 0 and fn.failure is None
    finally:
        compiling.configure(compile=previous.compile, cxx=previous.cxx)
    assert fn.enabled  # switched back on


def test_a_named_compiler_that_is_absent_means_no_compiler():
    previous = compiling.configure(cxx="no-such-compiler-here++")
    try:
        assert compiling.cxx_compiler() is None and not compiling.can_compile("cpu")
        assert "no C++ compiler" in (compiling.compile_blocker("cpu") or "")
        assert compiling.can_compile("cuda")  # CUDA's kernels need no C++ compiler
    finally:
        compiling.configure(compile=previous.compile, cxx=previous.cxx)
