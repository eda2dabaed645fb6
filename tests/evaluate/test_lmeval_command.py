"""``lm_eval --model gptlab``: lm-eval's own command, once gptlab is installed (``setup.py`` adds a start-up
hook, ``gptlab_lmeval_hook.pth``; src/gptlab_lmeval_hook.py says why lm-eval 0.4.13 needs one).

gptlab is installed twice into throwaway environments, from a wheel and with ``pip install -e`` (the
Makefile's way), with no dependencies: those come from this interpreter's site-packages on PYTHONPATH,
which Python does not scan for ``.pth`` files, so the hook runs only where gptlab's install put it.
The wheel's build and install is marked slow (``make test-slow``; CI runs both).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from tests import ROOT
from tests.evaluate._lmeval import EVALS, require

LM_EVAL = Path(sys.executable).parent / "lm_eval"  # lm-eval's own console script in this environment
STARTUP = (
    "import json, sys; print(json.dumps({'finders': [type(f).__name__ for f in sys.meta_path],"
    " 'loaded': sorted(m for m in ('torch', 'gptlab', 'lm_eval') if m in sys.modules)}))"
)


def pip(*args: str, env: dict[str, str] | None = None) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True, text=True, timeout=600, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.fixture(scope="module", params=[pytest.param("wheel", marks=pytest.mark.slow), "editable"])
def installed(request, tmp_path_factory) -> tuple[Path, dict[str, str]]:
    """A venv holding gptlab alone, and the environment that runs it on this interpreter's packages."""
    require("lm_eval", "setuptools")
    # pip by its metadata: importlib.util.find_spec("pip") would switch setuptools' distutils shim off for the
    # whole process (_distutils_hack's spec_for_pip), and a later torch.compile in it would fail
    try:
        importlib.metadata.version("pip")
    except importlib.metadata.PackageNotFoundError:
        require("pip")  # skips with the reason, or fails under GPTLAB_REQUIRE_SHARED=1
    if not LM_EVAL.exists():
        pytest.skip(f"lm-eval's console script is not at {LM_EVAL}")
    tmp = tmp_path_factory.mktemp(request.param)
    source = tmp / "source"  # a copy: building writes build/ and *.egg-info beside the sources
    shutil.copytree(ROOT / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, source / name)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    deps = os.pathsep.join(site.getsitepackages())
    env = {**os.environ, "PYTHONPATH": deps, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    common = ["--no-deps", "--no-build-isolation", "--quiet"]
    if request.param == "wheel":
        pip("wheel", *common, "-w", str(tmp / "dist"), str(source), env=env)
        (wheel,) = (tmp / "dist").glob("gptlab-*.whl")
        pip("--python", str(python), "install", *common, str(wheel), env=env)
    else:
        pip("--python", str(python), "install", *common, "-e", str(source), env=env)
    return python, env


def test_start_up_runs_the_hook_and_imports_neither_torch_nor_gptlab(installed):
    python, env = installed
    done = subprocess.run([str(python), "-c", STARTUP], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    state = json.loads(done.stdout)
    assert state["finders"][0] == "Finder"  # the .pth line ran: the hook is installed …
    assert state["loaded"] == []  # … and imported nothing heavy


def test_lm_evals_own_command_runs_the_gptlab_model(installed, checkpoint, tmp_path):  # noqa: F811
    """lm-eval's console script, run by the throwaway interpreter: ``--model gptlab`` and lm-eval's own
    models both resolve, and the results come from the installed gptlab."""
    python, env = installed
    out = tmp_path / "out"
    cmd = [str(python), str(LM_EVAL), "--model", "gptlab", "--model_args", f"pretrained={checkpoint},dtype=fp32",
           "--tasks", "gptlab_choice", "--include_path", str(EVALS), "--limit", "3", "--device", "cpu",
           "--output_path", str(out)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = out.rglob("results_*.json")
    results = json.loads(written.read_text())
    assert results["config"]["model"] == "gptlab"
    assert 0.0 <= results["results"]["gptlab_choice"]["acc,none"] <= 1.0
    check = (
        "import gptlab, lm_eval.api.registry as r; print(gptlab.__file__); "
        "print(r.get_model('gptlab').__module__, r.get_model('hf').__name__)"
    )
    done = subprocess.run([str(python), "-c", check], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    where, names = done.stdout.splitlines()
    assert Path(where).is_relative_to(python.parents[1]) or "source" in Path(where).parts
    assert names == "gptlab.evaluate.harness HFLM"


def test_the_venvs_own_lm_eval_runs_gptlab_where_gptlab_was_installed_with_the_hook(checkpoint, tmp_path):  # noqa: F811
    """This environment's own ``lm_eval``, where gptlab was installed after the hook existed (CI's fresh venv)."""
    require("lm_eval")
    if not any((Path(d) / "gptlab_lmeval_hook.pth").exists() for d in site.getsitepackages()):
        reason = "gptlab was installed here before its lm-eval hook: pip install -e '.[eval]' again"
        if os.environ.get("GPTLAB_REQUIRE_SHARED") == "1":
            pytest.fail(f"GPTLAB_REQUIRE_SHARED=1 but {reason}")
        pytest.skip(reason)
    cmd = [str(LM_EVAL), "--model", "gptlab", "--model_args", f"pretrained={checkpoint},dtype=fp32",
           "--tasks", "gptlab_choice", "--include_path", str(EVALS), "--limit", "2", "--device", "cpu",
           "--output_path", str(tmp_path)]  # fmt: skip
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (written,) = tmp_path.rglob("results_*.json")
    assert "acc,none" in json.loads(written.read_text())["results"]["gptlab_choice"]
