"""A compiled one-row step as the compile cache keeps it, without compiling one: a fake package with its
record (what ``PreparedDecoding.step_kept`` looks for), and a stand-in for the loaded step that runs the
step's own code eagerly and records each call (the switch to it is under test, not AOTInductor)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from gptlab.generate import prepared_of
from gptlab.generate.one_token import PACKAGE, RECORD, StoredStep, decode_one_token


def store_a_fake(store: StoredStep, model, *, key_change: dict | None = None, damage: bool = False) -> Path:
    """A package and its record in ``model``'s folder of ``store`` (float32 cache); ``key_change``
    edits the recorded key, ``damage`` changes the package after its checksum was recorded."""
    key = store.key(model, torch.float32)
    folder = store.folder(key)
    folder.mkdir(parents=True, exist_ok=True)  # (a background compile may have claimed it)
    (folder / PACKAGE).write_bytes(b"not a package, but its checksum is recorded")
    digest = hashlib.sha256((folder / PACKAGE).read_bytes()).hexdigest()
    if damage:
        (folder / PACKAGE).write_bytes(b"not a package, and changed since")
    record = {"key": {**key, **(key_change or {})}, "sha256": digest, "file": PACKAGE}
    (folder / RECORD).write_text(json.dumps(record, default=str))
    return folder


def keep_a_recording_step(model, root: Path) -> list[int]:
    """Keep a fake step for ``model`` in the compile cache ``root`` and make the model's engine run,
    in its place, ``decode_one_token`` eagerly → the rows of each call it runs (one entry a call)."""
    store_a_fake(StoredStep(root), model)
    calls: list[int] = []

    def one_row(m, idx, pos, keys, values, end):
        calls.append(keys[0].size(0))
        return decode_one_token(m, idx, pos, keys, values, end)  # the step's own code

    prepared_of(model)._one_token = one_row  # type: ignore[assignment]  # (stands in for the loaded package)
    return calls


def keep_a_recording_prompt(model, root: Path) -> list[int]:
    """Keep a fake prompt pass for ``model`` in the compile cache ``root`` (beside its step's folder) and
    make the model's engine run, in its place, ``prompt_pass`` eagerly → each prompt's length it took."""
    from gptlab.generate.prompt_pass import PROMPT, prompt_pass

    store = StoredStep(root, PROMPT)
    folder = store.place(model, torch.float32)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / PROMPT.package).write_bytes(b"not a package")
    digest = hashlib.sha256((folder / PROMPT.package).read_bytes()).hexdigest()
    record = {"key": store.key(model, torch.float32), "sha256": digest, "file": PROMPT.package}
    (folder / PROMPT.record).write_text(json.dumps(record, default=str))
    calls: list[int] = []

    def kept(m, idx, pos, keys, values):
        calls.append(idx.size(1))
        return prompt_pass(m, idx, pos, keys, values)  # the pass's own code

    engine = prepared_of(model)
    engine.prompt._run, engine.prompt._tried = kept, True  # (stands in for the loaded package)
    return calls
