"""Serving: an OpenAI-compatible HTTP API over a batching scheduler, and a web playground.

``create_app(model, tokenizer, ...)`` builds the FastAPI app (``app.py``); ``gptlab serve CKPT``
runs it with uvicorn. The parts: ``scheduler.py`` (slots, batching; the thread that owns the
model), ``jobs.py`` (a request's jobs, channel and events), ``admission.py`` (fair admission),
``service.py`` (the rules of every endpoint, testable without HTTP), ``openai_routes.py`` and
``gptlab_routes.py`` (the routes), ``errors.py`` (OpenAI's error shape), ``schemas.py`` (request
bodies and their bounds), ``openapi.py`` (the served schema), ``middleware.py`` (API key, body
limit), ``launch.py`` (binding and loading), and ``static/`` (the playground).
"""

from gptlab.serve.app import create_app
from gptlab.serve.service import CHAT_STOP, Service, chat_prompt

__all__ = ["CHAT_STOP", "Service", "chat_prompt", "create_app"]
