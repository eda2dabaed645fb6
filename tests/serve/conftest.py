"""Fixtures of the server tests: the tiny float32 model with an end-of-text token, and a test client of
its server (module-scoped). A module that serves another model defines its own ``tok``, ``model`` and
``client``, which then take the place of these."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from gptlab.serve import create_app
from gptlab.tokenizers import CharTokenizer
from tests._tiny import ALPHABET
from tests.serve._serving import EOT, tiny_model


@pytest.fixture(scope="module")
def tok() -> CharTokenizer:
    return CharTokenizer.from_text(ALPHABET, special_tokens=[EOT])


@pytest.fixture(scope="module")
def model(tok):
    return tiny_model(tok.vocab_size).float()


@pytest.fixture(scope="module")
def client(model, tok):
    with TestClient(create_app(model, tok, model_name="tiny", max_batch=4)) as c:
        yield c
