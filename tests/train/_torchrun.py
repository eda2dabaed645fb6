"""Training under torchrun (2 gloo ranks on CPU), shared by the FSDP, sharded-Muon and kill-and-resume tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from gptlab import checkpoint as ckpt
from gptlab.checkpoint import sharded
from gptlab.data import prepare


def line_dataset(tmp_path: Path) -> Path:
    """500 lines of text prepared as a dataset of 16-token blocks (``tmp_path/ds``)."""
    text = "\n".join(f"line {i}: the cat sat on mat number {i % 13} and purred." for i in range(500))
    (tmp_path / "c.txt").write_text(text)
    prepare([tmp_path / "c.txt"], tmp_path / "ds", block_size=16)
    return tmp_path / "ds"


def torchrun_train(nproc: int, args: list[str], **kw: object) -> subprocess.Popen[str]:
    """``torchrun --standalone --nproc_per_node=NPROC -m gptlab train ARGS``, one thread per rank;
    torchrun's logs go beside the run (``ARGS``'s ``--out``), not into a ``torchelastic_*`` folder of
    the system's temporary directory that nothing removes."""
    torchrun = Path(sys.executable).with_name("torchrun")
    launcher = [str(torchrun)] if torchrun.exists() else [sys.executable, "-m", "torch.distributed.run"]
    logs = Path(args[args.index("--out") + 1]).parent / "torchrun-logs"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    return subprocess.Popen(
        [*launcher, "--standalone", f"--nproc_per_node={nproc}", f"--log-dir={logs}"]
        + ["-m", "gptlab", "train", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        **kw,  # type: ignore[arg-type]
    )


def finish(proc: subprocess.Popen[str]) -> None:
    """Wait for ``proc``; it must exit 0."""
    out, err = proc.communicate(timeout=400)
    assert proc.returncode == 0, err[-3000:]


def final_weights(run: Path, tmp_path: Path, name: str) -> dict[str, torch.Tensor]:
    """The tensors of ``run``'s latest checkpoint (sharded ones consolidated into ``tmp_path/name``)."""
    latest = ckpt.resolve_checkpoint(run)
    if sharded.is_sharded(latest):
        latest = sharded.consolidate(run, tmp_path / name)
    return ckpt.read_tensors(latest / ckpt.WEIGHTS_FILE)
