"""The tests, one folder per package of ``src/gptlab`` (``tests/model/`` tests ``gptlab.model``), as the
package ``tests`` so that pytest puts the checkout's root on ``sys.path``: the tests import their
helpers (``from tests._tiny import TINY_TRAIN``) and the benchmarks' pieces (``from bench import
roofline``) as modules, never by path."""

from pathlib import Path

#: the checkout's root (README.md, src/, bench/, docs/)
ROOT = Path(__file__).resolve().parents[1]
