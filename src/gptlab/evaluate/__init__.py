"""Evaluation in one place: how good a model is, on text, on continuations and on benchmark tasks.

loss.py       mean cross-entropy, perplexity ``exp(loss)`` and bits per byte over token windows (the
              trainer's periodic evaluation calls it)
text.py       ``gptlab eval SRC --text FILE | --data DIR``: any model scored on a text or a dataset split
scoring.py    log p(continuation | context), rolling log-likelihood, a prompt's own token log-probabilities
              (the server's ``echo`` logprobs)
opening.py    any model gptlab opens, in a weight format, for scoring
harness.py    the lm-evaluation-harness model ``gptlab`` (the optional ``eval`` extra)
tasks.py      ``gptlab eval SRC --tasks NAMES``: lm-eval tasks run in-process
compare.py    ``gptlab compare``: several runs' loss curves on one plot and their final figures

Its layer sits between ``sources`` and the applications (``docs/design/layers.md``): it imports the
model, ``generate``, ``data``, ``checkpoint`` and ``sources``; the trainer (periodic evaluation) and the
server (``echo`` logprobs) import it, and it imports neither.
"""
