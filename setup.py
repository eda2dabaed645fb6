"""Everything is declared in pyproject.toml; this file only adds ``gptlab_lmeval_hook.pth`` to site-packages.

A ``.pth`` file has to sit at the top of site-packages, which no pyproject setting can express. Its one line
runs ``gptlab_lmeval_hook.install()`` at interpreter start-up, so that lm-eval's own ``lm_eval --model gptlab``
finds the model (src/gptlab_lmeval_hook.py says why and how). ``build_py`` writes it beside the packages: into
the build directory for a wheel, and into the editable wheel for ``pip install -e`` (setuptools' editable
installs collect the ``install_lib`` directory, not the build directory).
"""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

PTH = "gptlab_lmeval_hook.pth"
# the hook module may be absent (an editable install whose src/ moved): then do nothing, silently
LINE = (
    "import sys; exec('try:\\n import gptlab_lmeval_hook\\nexcept ImportError:\\n pass\\n"
    "else:\\n gptlab_lmeval_hook.install()')\n"
)


class BuildPyWithPth(build_py):
    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            target = Path(self.get_finalized_command("install").install_lib)
        else:
            target = Path(self.build_lib)
        target.mkdir(parents=True, exist_ok=True)
        (target / PTH).write_text(LINE, encoding="utf-8")

    def get_outputs(self, include_bytecode: bool = True) -> list[str]:
        return [*super().get_outputs(include_bytecode), str(Path(self.build_lib) / PTH)]


setup(cmdclass={"build_py": BuildPyWithPth})
