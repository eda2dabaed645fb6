"""bench/cold_start.py's measuring pieces: the first output past a prefix, CPU seconds from /proc."""

from __future__ import annotations

import os
import sys

import pytest

from bench import cold_start


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="CPU seconds are read from Linux's /proc")
def test_until_output_times_the_first_bytes_past_the_prefix_and_the_exit():
    code = "import sys, time; print('PROMPT', end='', flush=True); time.sleep(0.3); print(' token')"
    first, total = cold_start.until_output(
        [sys.executable, "-c", code], dict(os.environ), after=len("PROMPT")
    )
    assert 0.3 <= first <= total  # the prompt's own echo does not count as a token
    assert cold_start.CPU["first"] >= 0
    assert cold_start.cpu_seconds(os.getpid()) > 0


def test_a_command_that_fails_is_an_error_with_its_stderr():
    code = "import sys; sys.stderr.write('boom'); sys.exit(3)"
    with pytest.raises(RuntimeError, match="boom"):
        cold_start.until_output([sys.executable, "-c", code], dict(os.environ), after=0)


def test_no_measured_command_starts_a_background_compilation():
    """A background ``gptlab compile`` would take the cores from the figures measured after it."""
    assert cold_start._env(None)["GPTLAB_BACKGROUND_COMPILE"] == "0"
    assert cold_start.COMPILED[0] == "--compile-cache"  # every command names its compile cache
