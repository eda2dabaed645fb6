"""No library module reads the environment: a choice is an argument, a setting or a printed plan.

Only ``gptlab/cli/`` (argument parsing, where ``GPTLAB_COMPILE``, ``GPTLAB_STATIC``, ``CXX`` and
``GPTLAB_API_KEY`` become settings) reads environment variables, and the distributed set-up reads
torchrun's own (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``). Checked on the
syntax tree of every module, so an alias (``from os import environ``) is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import gptlab

SRC = Path(gptlab.__file__).parent
#: torchrun's variables, read where the distributed process group is set up
TORCHRUN = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
DISTRIBUTED = SRC / "train" / "distributed.py"
READERS = {"environ", "environb", "getenv", "getenvb"}


def reads(tree: ast.AST) -> list[tuple[int, str | None]]:
    """Every read of the environment in ``tree``: (line, the variable's name where it is a literal)."""
    found: list[tuple[int, str | None]] = []
    aliases = {
        a.asname or a.name
        for n in ast.walk(tree)
        if isinstance(n, ast.ImportFrom) and n.module == "os"
        for a in n.names
        if a.name in READERS
    }
    for node in ast.walk(tree):
        is_read = (isinstance(node, ast.Attribute) and node.attr in READERS) or (
            isinstance(node, ast.Name) and node.id in aliases
        )
        if is_read:
            found.append((node.lineno, None))
    named: dict[int, str] = {}
    for node in ast.walk(tree):  # os.environ["X"], os.environ.get("X"), os.getenv("X"): the literal name
        key = None
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key = node.slice.value
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            key = node.args[0].value
        if isinstance(key, str):
            named[node.lineno] = key
    return [(line, named.get(line)) for line, _ in found]


def offenders() -> list[str]:
    out = []
    for path in sorted(SRC.rglob("*.py")):
        if SRC / "cli" in path.parents:
            continue
        for line, name in reads(ast.parse(path.read_text(), str(path))):
            if path == DISTRIBUTED and name in TORCHRUN:
                continue
            out.append(f"{path.relative_to(SRC)}:{line} reads {name or 'the environment'}")
    return out


def test_no_module_outside_the_cli_reads_the_environment():
    assert offenders() == []


def test_the_check_catches_every_way_of_reading():
    sources = [
        "import os\nx = os.environ.get('GPTLAB_COMPILE')",
        "import os\nx = os.environ['CXX']",
        "import os\nx = os.getenv('HOME')",
        "from os import environ as e\nx = e['HOME']",
        "from os import getenv\nx = getenv('HOME')",
        "import os\nx = dict(os.environ)",
    ]
    for source in sources:
        assert reads(ast.parse(source)), source
    assert not reads(ast.parse("import os\nx = os.path.join('a', 'b')"))
    assert reads(ast.parse("import os\nr = int(os.environ['RANK'])")) == [(2, "RANK")]


def test_the_distributed_setup_reads_only_torchruns_variables():
    names = {name for _, name in reads(ast.parse(DISTRIBUTED.read_text()))}
    assert names and names <= TORCHRUN, names
