"""``python -m gptlab`` (and ``torchrun -m gptlab``) runs the CLI."""

from gptlab.cli import main

raise SystemExit(main())
