"""``python -m gptlab.evaluate ARGS``: lm-eval's own command line with the ``gptlab`` model registered.

    python -m gptlab.evaluate --model gptlab --model_args pretrained=CKPT --tasks NAMES [lm_eval options]

lm-eval 0.4.13 finds models only in its own table and in modules imported before it runs, so this
imports ``gptlab.evaluate.harness`` and hands the arguments to ``lm_eval``'s ``cli_evaluate``.
"""

from __future__ import annotations

import sys

from gptlab.evaluate.tasks import INSTALL


def main() -> None:
    try:
        from lm_eval.__main__ import cli_evaluate
    except ImportError:
        print(f"error: {INSTALL}", file=sys.stderr)
        raise SystemExit(2) from None
    import gptlab.evaluate.harness  # noqa: F401  (registers "gptlab")
    from gptlab.errors import GptlabError

    try:
        cli_evaluate()
    except GptlabError as exc:  # bad input (a checkpoint, a dtype …): one line, no traceback
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
