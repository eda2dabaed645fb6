"""``GptlabConfig``: a gptlab ``GPTConfig`` (the ``gptlab`` entry of ``config.json``) for transformers.

The usual transformers fields (``vocab_size``, ``hidden_size``, ``num_hidden_layers``, ``bos_token_id``,
…) are written beside it so that pipelines and ``generate`` find them; the model is built from
``gptlab`` alone.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig


class GptlabConfig(PretrainedConfig):
    """``config.gptlab``: the ``GPTConfig`` fields of the exported model, as a dict."""

    model_type = "gptlab"

    def __init__(self, gptlab: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.gptlab = dict(gptlab or {})
        super().__init__(**kwargs)
