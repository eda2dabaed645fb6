"""Serving: an OpenAI-compatible HTTP API over a batching scheduler, and a web playground.

``create_app(model, tokenizer, ...)`` builds the FastAPI app; ``gptlab serve CKPT`` runs it
with uvicorn. The scheduler thread (``scheduler.py``) owns the model; request bodies are
in ``schemas.py``; the playground is ``static/index.html``.
"""

from gptlab.serve.app import CHAT_STOP, chat_prompt, create_app

__all__ = ["CHAT_STOP", "chat_prompt", "create_app"]
