"""What the structured-output tests share: a character vocabulary that can spell JSON, the schemas
they ask for, and a validator for the JSON Schema keywords those schemas use (``jsonschema`` where it
is installed, else ``validate`` below, which checks each keyword itself); ``matches``, the tool-call
tests' yes-or-no check of a call's arguments."""

from __future__ import annotations

from typing import Any

from tests._tiny import ALPHABET

#: the tiny model's letters plus what JSON needs; ``<|endoftext|>`` ends a reply
JSON_ALPHABET = ALPHABET + '{}[]"0123456789-+_'

#: schemas of every kind the issue names: nested objects, bounded arrays, enums, numbers with bounds,
#: booleans, optional fields
SCHEMAS: dict[str, dict[str, Any]] = {
    "flat": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 120},
            "ok": {"type": "boolean"},
        },
        "required": ["name", "age", "ok"],
        "additionalProperties": False,
    },
    "nested": {
        "type": "object",
        "properties": {
            "user": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 9},
                    "role": {"enum": ["admin", "guest", "dev"]},
                },
                "required": ["id", "role"],
                "additionalProperties": False,
            },
            "tags": {
                "type": "array",
                "items": {"enum": ["a", "b", "c"]},
                "minItems": 1,
                "maxItems": 3,
            },
        },
        "required": ["user", "tags"],
        "additionalProperties": False,
    },
    "numbers": {
        "type": "object",
        "properties": {
            "x": {"type": "number", "minimum": -5, "maximum": 5},
            "n": {"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 50},
            "flag": {"type": "boolean"},
            "note": {"type": "string", "maxLength": 4},  # optional
        },
        "required": ["x", "n", "flag"],
        "additionalProperties": False,
    },
    "array": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 99},
        "minItems": 2,
        "maxItems": 4,
    },
}

TYPES: dict[str, Any] = {
    "object": dict,
    "array": list,
    "string": str,
    "boolean": bool,
    "null": type(None),
}


def _problems(value: Any, schema: dict[str, Any], where: str) -> list[str]:
    out: list[str] = []
    kind = schema.get("type")
    if kind == "integer":
        if not (isinstance(value, int) and not isinstance(value, bool)):
            return [f"{where}: {value!r} is not an integer"]
    elif kind == "number":
        if not (isinstance(value, int | float) and not isinstance(value, bool)):
            return [f"{where}: {value!r} is not a number"]
    elif kind is not None and not isinstance(value, TYPES[kind]):
        return [f"{where}: {value!r} is not of type {kind}"]
    if "enum" in schema and value not in schema["enum"]:
        out.append(f"{where}: {value!r} is not one of {schema['enum']}")
    if "const" in schema and value != schema["const"]:
        out.append(f"{where}: {value!r} is not {schema['const']!r}")
    bounds = {
        "minimum": lambda v, b: v >= b,
        "maximum": lambda v, b: v <= b,
        "exclusiveMinimum": lambda v, b: v > b,
        "exclusiveMaximum": lambda v, b: v < b,
    }
    for key, ok in bounds.items():
        if key in schema and not ok(value, schema[key]):
            out.append(f"{where}: {value!r} breaks {key}={schema[key]}")
    if isinstance(value, str):
        if len(value) > schema.get("maxLength", len(value)) or len(value) < schema.get("minLength", 0):
            out.append(f"{where}: {value!r} has the wrong length")
    if isinstance(value, list):
        if not schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)):
            out.append(f"{where}: {len(value)} items, outside the bounds")
        for i, item in enumerate(value):
            out += _problems(item, schema.get("items", {}), f"{where}[{i}]")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        out += [f"{where}: {k!r} is missing" for k in schema.get("required", []) if k not in value]
        if schema.get("additionalProperties") is False:
            out += [f"{where}: {k!r} is not allowed" for k in value if k not in props]
        for k, v in value.items():
            if k in props:
                out += _problems(v, props[k], f"{where}.{k}")
    return out


def validate(value: Any, schema: dict[str, Any]) -> None:
    """Raise ``AssertionError`` naming what in ``value`` breaks ``schema``."""
    try:
        import jsonschema
    except ImportError:
        problems = _problems(value, schema, "$")
        assert not problems, problems
    else:
        jsonschema.validate(value, schema)


def matches(schema: dict, value: object) -> bool:
    """``value`` against the JSON Schema keywords the tests use."""
    if "enum" in schema and value not in schema["enum"]:
        return False
    kind = schema.get("type")
    if kind == "object":
        if not isinstance(value, dict) or any(k not in value for k in schema.get("required", [])):
            return False
        props = schema.get("properties", {})
        if schema.get("additionalProperties") is False and set(value) - set(props):
            return False
        return all(matches(props[k], v) for k, v in value.items() if k in props)
    if kind == "string":
        return isinstance(value, str) and len(value) <= schema.get("maxLength", len(value))
    if kind == "integer":
        return (
            isinstance(value, int)
            and not isinstance(value, bool)
            and schema.get("minimum", value) <= value <= schema.get("maximum", value)
        )
    if kind == "boolean":
        return isinstance(value, bool)
    return True
