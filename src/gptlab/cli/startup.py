"""A command's start with Python's cyclic garbage collector paused.

Starting ``gptlab sample`` allocates about a million objects that live as long as the process: torch's
modules and functions, the model's modules, a pretrained vocabulary of 49,152 tokens and its merges.
Each burst of allocations sets off the cyclic collector, whose passes walk those objects again and
find no garbage among them: 0.15 s of ``import torch`` and 0.1 s of building SmolLM2's tokenizer on the
2-core CPU of ``docs/benchmarks.md``.

* ``pause``, as a command starts: the collector off.
* ``started``, once the command's model is loaded: everything built so far moves to the permanent
  generation (``gc.freeze``), which no later pass walks, and the collector runs again. A command that
  loads no model never pauses (``main`` resumes at once).
* ``resume``, as the command returns: the same where the command did not get there, then the frozen
  objects go back to the collector (``gc.unfreeze``), so a longer-lived process that calls
  ``gptlab.cli.main`` keeps nothing it would otherwise free. The ``gptlab`` command itself
  (``gptlab.cli.entry``) ends with it and keeps them frozen: the interpreter's last collection, as
  it shuts down, then skips them (0.35–0.4 s of every command's exit on that CPU, measured on
  ``gptlab sample smollm2``: 1.52–1.65 s for the whole process against 1.98–2.01 s).

A collector that the caller had switched off stays off, and nothing is frozen for it.
"""

from __future__ import annotations

import gc

_state = {"paused": False, "frozen": False}


def pause() -> None:
    """Switch the collector off until ``started`` (only if it is on)."""
    if gc.isenabled():
        gc.disable()
        _state["paused"] = True


def started() -> None:
    """The start is over: freeze what it built and switch the collector back on (if ``pause`` did)."""
    if _state["paused"]:
        gc.freeze()
        gc.enable()
        _state.update(paused=False, frozen=True)


def resume(keep_frozen: bool = False) -> None:
    """The command returns: the collector as the caller had it, nothing left frozen (``keep_frozen``:
    the process ends now, and its last collection need not walk what the start built)."""
    started()
    if _state["frozen"] and not keep_frozen:
        gc.unfreeze()
        _state["frozen"] = False
