"""Checkpoints and run directories: the only package that reads or writes them.

A checkpoint is a directory::

    config.json         {"gptlab_format": 1, "model": GPTConfig.to_dict()}
    model.safetensors   the weights (a tied head is stored once, as wte.weight)
    tokenizer.json      optional: the tokenizer (JSON, see gptlab.tokenizers)
    checksums.json      the SHA-256 of the files above, written last; verified by every load

A run directory (written by ``gptlab train``) holds checkpoints ``ckpt-<step>/``;
each is written under a temporary name and renamed into place when complete, so a
``ckpt-*`` directory that exists is complete. ``load(RUN_DIR)`` takes the latest.

    files.py   file names, safetensors and JSON reads/writes, resolving a path to a checkpoint
    integrity.py  the SHA-256 of a checkpoint's files: recorded (checksums.json) and verified
    model.py   one checkpoint: ``save``/``load`` a model (and its tokenizer)
    run.py     training checkpoints in a run directory: state, cleaning, pruning
    rundir.py  a run directory as a whole: its settings, new or resumed, clearing a run
    lora.py    LoRA checkpoints: adapters + a reference to the base (merged on load by gptlab.sources)

Every file is written atomically (temporary file, fsync, rename). Nothing is pickled.
"""

from gptlab.checkpoint.files import (
    CKPT_PATTERN,
    CONFIG_FILE,
    FORMAT_VERSION,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    list_checkpoints,
    read_json,
    read_tensors,
    resolve_checkpoint,
    write_config,
    write_tensors,
)
from gptlab.checkpoint.integrity import CHECKSUMS_FILE, verify_checksums, write_checksums
from gptlab.checkpoint.model import (
    check_tokenizer_fits,
    load,
    load_tokenizer,
    read_config,
    restore_weights,
    save,
    stored_format,
    usable_config,
)
from gptlab.checkpoint.run import (
    TRAIN_STATE_FILE,
    TRAIN_TENSORS_FILE,
    clean_incomplete,
    flatten_state,
    prune_checkpoints,
    read_training_checkpoint,
    save_training_checkpoint,
    unflatten_state,
)
from gptlab.checkpoint.rundir import (
    BEST_FILE,
    RUN_CONFIG_FILE,
    check_new_run,
    check_resumable,
    clear_run,
    discard_failed_start,
    holds_run,
    latest_step,
    read_run_config,
    write_run_config,
)
from gptlab.model.state_dict import load_model_state, model_state

__all__ = [
    "CHECKSUMS_FILE",
    "verify_checksums",
    "write_checksums",
    "BEST_FILE",
    "RUN_CONFIG_FILE",
    "check_new_run",
    "check_tokenizer_fits",
    "check_resumable",
    "clear_run",
    "discard_failed_start",
    "holds_run",
    "latest_step",
    "read_run_config",
    "write_run_config",
    "CKPT_PATTERN",
    "CONFIG_FILE",
    "FORMAT_VERSION",
    "TOKENIZER_FILE",
    "TRAIN_STATE_FILE",
    "TRAIN_TENSORS_FILE",
    "WEIGHTS_FILE",
    "clean_incomplete",
    "flatten_state",
    "list_checkpoints",
    "load",
    "load_model_state",
    "load_tokenizer",
    "model_state",
    "prune_checkpoints",
    "read_config",
    "usable_config",
    "read_json",
    "read_tensors",
    "read_training_checkpoint",
    "resolve_checkpoint",
    "restore_weights",
    "save",
    "save_training_checkpoint",
    "stored_format",
    "unflatten_state",
    "write_config",
    "write_tensors",
]
