"""``python -m gptlab`` (and ``torchrun -m gptlab``) runs the CLI."""

from gptlab.cli import entry

raise SystemExit(entry())
