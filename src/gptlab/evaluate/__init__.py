"""Evaluation with EleutherAI's lm-evaluation-harness (the optional ``eval`` extra).

Layer 7 (beside ``train/``, ``serve/``, ``inspect/``): it opens models (layer 6) and scores them with
``gptlab.generate.scoring`` (layer 4). ``gptlab.evaluate.harness`` holds the lm-eval model ``gptlab``;
``gptlab.evaluate.tasks`` runs tasks in-process for ``gptlab eval --tasks``.
"""
