"""How a model writes JSON under a schema: the layout, and where a small model must be stopped.

A reply constrained by a JSON Schema (``response_format``, ``--json-schema``, a tool call's
arguments) is sampled under the grammar the engine (llguidance) compiles from it. Two things a
schema leaves open let a small model run on until ``max_tokens``, with no valid JSON at the end:

- **free whitespace**: ``LAYOUT`` asks for none, with the separators of Python's ``json.dumps``
  (``{"a": 1, "b": [2, 3]}``, the tokens BPE vocabularies know best);
- **an integer without bounds**: a greedy SmolLM2 wrote ``"population": 1111…`` for 150 tokens.
  ``as_written`` bounds such an integer to I-JSON's exact range (RFC 7493),
  ``|n| ≤ 2⁵³ − 1``: at most 16 digits, as llama.cpp's schema grammars allow at most 16, and every
  JSON reader (JavaScript's included) reads it exactly. A bound the schema gives is kept.

    >>> as_written({"type": "integer"})["maximum"] == 2**53 - 1
    True
    >>> as_written({"type": "integer", "minimum": 0})["minimum"]
    0
"""

from __future__ import annotations

import copy
from typing import Any

#: the JSON layout of a constrained reply (llguidance's ``x-guidance`` options)
LAYOUT: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
#: I-JSON's exact integers (RFC 7493): an integer without bounds is read as one of these
SAFE_INTEGER = 2**53 - 1
# keywords whose values are JSON data, not schemas: never rewritten
_DATA = frozenset({"const", "enum", "default", "examples"})


def as_written(schema: Any) -> Any:
    """A copy of ``schema`` in which every integer without a bound has I-JSON's: ``minimum`` −(2⁵³ − 1)
    where neither ``minimum`` nor ``exclusiveMinimum`` is given, ``maximum`` 2⁵³ − 1 likewise."""
    return _bounded(copy.deepcopy(schema))


def _bounded(node: Any) -> Any:
    if isinstance(node, list):
        for item in node:
            _bounded(item)
    elif isinstance(node, dict):
        kind = node.get("type")
        if kind == "integer" or (isinstance(kind, list) and "integer" in kind):
            if "minimum" not in node and "exclusiveMinimum" not in node:
                node["minimum"] = -SAFE_INTEGER
            if "maximum" not in node and "exclusiveMaximum" not in node:
                node["maximum"] = SAFE_INTEGER
        for key, value in node.items():
            if key not in _DATA:
                _bounded(value)
    return node
