"""Kill a training subprocess with SIGKILL at random moments, then let it finish (shared by the resume tests)."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from gptlab.train.metrics import read_metrics


def steps_logged(run: Path) -> int:
    return max((r["step"] for r in read_metrics(run / "metrics.jsonl")), default=0)


def kill_and_resume(
    launch: Callable[[bool], subprocess.Popen], run: Path, kills: int, most_steps: int = 4, seed: int = 0
) -> subprocess.Popen:
    """``kills`` SIGKILLs at random moments (mid-step, mid-checkpoint, ...), each after 1..``most_steps`` more
    logged steps, then a last resumed launch run to the end; no attempt may print a traceback."""
    rng = random.Random(seed)
    for attempt in range(kills + 1):
        proc = launch(attempt > 0)
        if attempt < kills:
            target = steps_logged(run) + rng.randint(1, most_steps)
            while proc.poll() is None and steps_logged(run) < target:
                time.sleep(0.005)
            time.sleep(rng.uniform(0, 0.03))
            proc.send_signal(signal.SIGKILL)
        _, err = proc.communicate(timeout=300)
        assert "Traceback" not in err, err
    assert proc.returncode == 0, err
    return proc


def kill_tree(pid: int) -> None:
    """SIGKILL a torchrun agent and its ranks (which torchrun starts in sessions of their own)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    for p in reversed(tree):  # the ranks first, so none sees its agent go and exits cleanly
        with contextlib.suppress(ProcessLookupError):  # it has gone by itself
            os.kill(p, signal.SIGKILL)
