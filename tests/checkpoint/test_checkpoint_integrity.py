"""Checkpoints that cannot be half-trusted: checksums verified on every load, the newest verified
checkpoint resumed, and an I/O error while saving (a full disk) one line with nothing lost."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptlab import checkpoint as ckpt
from gptlab.checkpoint.integrity import CHECKSUMS_FILE, verify_checksums, write_checksums
from gptlab.cli import main
from gptlab.data import prepare
from gptlab.errors import GptlabError
from tests._tiny import TINY_TRAIN

# bitwise CPU float32 numerics, so that a resumed run can be compared with an uninterrupted one
SETTINGS = [*TINY_TRAIN, "batch_size=4", "eval_every=1000", "ckpt_every=2", "keep_last=5"]
SETTINGS += ["device=cpu", "dtype=float32"]


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("integrity")
    (tmp / "c.txt").write_text("".join(f"line {i}: a small cat sat on mat {i % 7}.\n" for i in range(300)))
    prepare([tmp / "c.txt"], tmp / "ds", block_size=16)
    return tmp / "ds"


def _train(capsys, data: Path, run: Path, *extra: str, resume: bool = False) -> tuple[int, str, str]:
    argv = ["train", "--out", str(run), *SETTINGS, *extra]
    argv += ["--resume"] if resume else ["--data", str(data)]
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def _flip_a_byte(path: Path, offset: int = -7) -> None:
    """Change one bit of one byte near the end (inside the last tensor's data)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def _weights(run: Path) -> dict[str, torch.Tensor]:
    return ckpt.read_tensors(ckpt.resolve_checkpoint(run) / ckpt.WEIGHTS_FILE)


def test_every_checkpoint_records_the_sha256_of_its_files(capsys, dataset, tmp_path):
    assert _train(capsys, dataset, tmp_path / "run", "max_steps=2")[0] == 0
    latest = ckpt.resolve_checkpoint(tmp_path / "run")
    import json

    record = json.loads((latest / CHECKSUMS_FILE).read_text())["files"]
    assert sorted(record) == sorted(p.name for p in latest.iterdir() if p.name != CHECKSUMS_FILE)
    assert verify_checksums(latest) is True
    (latest / CHECKSUMS_FILE).unlink()
    assert verify_checksums(latest) is False  # an older checkpoint without checksums loads unverified


def test_a_changed_byte_is_refused_in_one_line_by_every_command_that_loads(capsys, dataset, tmp_path):
    run = tmp_path / "run"
    assert _train(capsys, dataset, run, "max_steps=2")[0] == 0
    weights = ckpt.resolve_checkpoint(run) / ckpt.WEIGHTS_FILE
    before = weights.read_bytes()
    _flip_a_byte(weights)
    ckpt.read_tensors(weights)  # safetensors itself has no checksum: the flipped bit reads fine
    for argv in (
        ["sample", str(run), "--prompt", "a", "--max-new-tokens", "2"],
        ["eval", str(run), "--data", str(dataset)],
        ["train", "--data", str(dataset), "--out", str(tmp_path / "ft"), f"init={run}", *SETTINGS],
        ["convert", "--to-hf", str(run), "--out", str(tmp_path / "hf")],
    ):
        assert main(argv) == 2, argv
        out, err = capsys.readouterr()
        assert err.count("\n") == 1 and err.startswith("error: "), (argv, err)
        assert f"{weights}: SHA-256 differs from checksums.json" in err, (argv, err)
    weights.write_bytes(before)  # restored: loads again
    assert main(["sample", str(run), "--prompt", "a", "--max-new-tokens", "2"]) == 0


def test_resume_takes_the_newest_checkpoint_that_verifies_and_ends_equal(capsys, dataset, tmp_path):
    full, run = tmp_path / "full", tmp_path / "run"
    assert _train(capsys, dataset, full, "max_steps=2")[0] == 0
    assert _train(capsys, dataset, full, "max_steps=6", resume=True)[0] == 0
    assert _train(capsys, dataset, run, "max_steps=2")[0] == 0
    assert _train(capsys, dataset, run, "max_steps=4", resume=True)[0] == 0
    bad = run / "ckpt-4" / ckpt.TRAIN_TENSORS_FILE
    _flip_a_byte(bad)
    code, out, err = _train(capsys, dataset, run, "max_steps=6", resume=True)
    assert code == 0, err
    (line,) = [x for x in err.splitlines() if x.startswith("warning: ")]
    assert f"{bad}: SHA-256 differs" in line and "resuming from ckpt-2" in line
    assert "Traceback" not in err
    # ckpt-4 was written again from ckpt-2's state, as the max_steps=6 run saw it
    assert verify_checksums(run / "ckpt-4")
    final, reference = _weights(run), _weights(full)
    for k in reference:
        assert torch.equal(final[k], reference[k]), k
    # a finished run whose last checkpoint is corrupt is not finished: it is trained again from ckpt-4
    _flip_a_byte(run / "ckpt-6" / ckpt.WEIGHTS_FILE)
    code, out, err = _train(capsys, dataset, run, "max_steps=6", resume=True)
    assert code == 0 and "this run is finished" not in out and "resuming from ckpt-4" in err, (out, err)
    assert verify_checksums(run / "ckpt-6")
    final = _weights(run)
    for k in reference:
        assert torch.equal(final[k], reference[k]), k
    for step in (4, 6):  # every checkpoint of the run but the first now fails: nothing left to resume
        _flip_a_byte(run / f"ckpt-{step}" / ckpt.WEIGHTS_FILE)
    _flip_a_byte(run / "ckpt-2" / ckpt.WEIGHTS_FILE)
    code, out, err = _train(capsys, dataset, run, "max_steps=8", resume=True)
    assert code == 2 and err.count("\n") == 1 and "no checkpoint of" in err and "verifies" in err


def _limited(limit: int) -> None:
    """In the child: files may grow to ``limit`` bytes; past it a write fails with EFBIG (no SIGXFSZ)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))


@pytest.mark.slow
def test_a_full_disk_while_saving_is_one_line_and_the_run_goes_on_afterwards(capsys, dataset, tmp_path):
    """A file-size limit below one checkpoint file (``RLIMIT_FSIZE``: writes past it fail with
    ``File too large``): one ``error:`` line, exit 2, the previous checkpoint intact and verified, no
    half-written directory; resumed without the limit, the run ends bitwise equal to one never stopped."""
    full, run = tmp_path / "full", tmp_path / "run"
    assert _train(capsys, dataset, full, "max_steps=2")[0] == 0
    assert _train(capsys, dataset, full, "max_steps=6", resume=True)[0] == 0
    assert _train(capsys, dataset, run, "max_steps=2")[0] == 0
    sizes = {p.name: p.stat().st_size for p in (run / "ckpt-2").iterdir()}
    limit = sizes[ckpt.WEIGHTS_FILE] - 1
    small = max(s for name, s in sizes.items() if not name.endswith(".safetensors"))
    assert small < limit and (run / "metrics.jsonl").stat().st_size < limit  # only a weights file hits it
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(sys.path)}
    argv = [sys.executable, "-m", "gptlab", "train", "--out", str(run), "--resume", *SETTINGS, "max_steps=6"]
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=env, preexec_fn=lambda: _limited(limit), timeout=300
    )
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if not x.startswith("hardware: ")]  # + the settings line
    assert line.startswith("error: cannot write checkpoint ckpt-4") and "File too large" in line, line
    assert "ckpt-2, is intact" in line and "--resume" in line
    assert [s for s, _ in ckpt.list_checkpoints(run)] == [2]
    assert not [p for p in run.iterdir() if p.name.startswith(".")]  # no half-written checkpoint left
    assert verify_checksums(run / "ckpt-2")
    assert _train(capsys, dataset, run, "max_steps=6", resume=True)[0] == 0  # space freed: it goes on
    final, reference = _weights(run), _weights(full)
    for k in reference:
        assert torch.equal(final[k], reference[k]), k


def test_saving_a_model_into_a_full_disk_is_one_gptlab_error(tmp_path, monkeypatch, tiny_model):
    model = tiny_model(vocab_size=30, block_size=8, n_layer=1, n_head=2, n_embd=16)
    import gptlab.checkpoint.files as files

    def full(*args, **kwargs):
        raise files.SafetensorError("Error while serializing: IoError(Os { code: 28, message: ... })")

    monkeypatch.setattr(files, "save_file", full)
    with pytest.raises(GptlabError, match="cannot write .*: Error while serializing"):
        ckpt.save(model, None, tmp_path / "c")
    assert not [p for p in (tmp_path / "c").iterdir()]  # no temporary file left behind


def test_a_listed_file_that_is_missing_or_a_corrupt_record_is_named(tmp_path):
    (tmp_path / "a.json").write_text("{}")
    write_checksums(tmp_path)
    (tmp_path / "a.json").unlink()
    with pytest.raises(GptlabError, match=r"a\.json: missing, but checksums\.json lists it"):
        verify_checksums(tmp_path)
    (tmp_path / CHECKSUMS_FILE).write_text('{"algorithm": "md5", "files": {}}')
    with pytest.raises(GptlabError, match="not a valid checksum record"):
        verify_checksums(tmp_path)


def test_a_full_disk_while_logging_is_one_line_naming_the_latest_checkpoint(
    capsys, dataset, tmp_path, monkeypatch
):
    """ENOSPC from metrics.jsonl (not a checkpoint) mid-run: one line, exit 2, and the run resumes."""
    import errno

    from gptlab.train.metrics import MetricsLog

    real = MetricsLog.log

    def log(self, record):
        if record.get("step", 0) >= 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))
        real(self, record)

    monkeypatch.setattr(MetricsLog, "log", log)
    run = tmp_path / "run"
    code, out, err = _train(capsys, dataset, run, "max_steps=6")
    (line,) = [x for x in err.splitlines() if not x.startswith("hardware: ")]  # + the settings line
    assert code == 2 and line.startswith("error: cannot write ") and "Traceback" not in err, err
    assert "No space left on device" in err and "ckpt-2, is intact" in err and "--resume" in err
    monkeypatch.setattr(MetricsLog, "log", real)
    assert _train(capsys, dataset, run, "max_steps=6", resume=True)[0] == 0
    assert ckpt.latest_step(run) == 6
