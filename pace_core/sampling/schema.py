"""JSON schemas as pace constrains them: objects closed by default.

An object schema that lists ``properties`` and says nothing of ``additionalProperties`` (or
``unevaluatedProperties``) allows only the properties it lists, as llama.cpp's schema
converter, vLLM's default grammar backend and OpenAI's strict mode treat it: a small model
otherwise keeps inventing keys until its token budget runs out. A schema that sets
``additionalProperties`` (``true`` or a schema) keeps its meaning; ``{"type": "object"}``
with no ``properties`` stays any object; an object that composes others (``allOf``, ``anyOf``,
``oneOf``, ``$ref``, ``if``, ``dependentSchemas`` beside its ``properties``) and the objects
directly under ``allOf`` are left open (each lists only part of the properties the whole
allows).
"""

from __future__ import annotations

from typing import Any

_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_LISTS = ("anyOf", "oneOf", "prefixItems")
_ONE = (
    "items", "additionalProperties", "unevaluatedProperties", "not", "if", "then", "else",
    "contains", "propertyNames", "additionalItems", "unevaluatedItems",
)  # fmt: skip


# keys beside ``properties`` that leave an object open: it says so, or others add properties
_OPENING = (
    "additionalProperties", "unevaluatedProperties", "allOf", "anyOf", "oneOf", "$ref", "if",
    "dependentSchemas",
)  # fmt: skip


def closed_objects(schema: Any) -> Any:
    """A copy of ``schema`` with every object schema that lists properties closed."""
    return _close(schema, close=True)


def _close(schema: Any, *, close: bool) -> Any:
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key in _MAPS and isinstance(value, dict):
            out[key] = {name: _close(sub, close=True) for name, sub in value.items()}
        elif key in _LISTS and isinstance(value, list):
            out[key] = [_close(sub, close=True) for sub in value]
        elif key == "allOf" and isinstance(value, list):
            out[key] = [_close(sub, close=False) for sub in value]
        elif key in _ONE:
            out[key] = _close(value, close=True)
        else:
            out[key] = value
    open_ended = any(key in schema for key in _OPENING)
    if close and "properties" in schema and _may_be_object(schema) and not open_ended:
        out["additionalProperties"] = False
    return out


def _may_be_object(schema: dict[str, Any]) -> bool:
    kind = schema.get("type", "object")
    return kind == "object" or (isinstance(kind, list) and "object" in kind)


def strict_problem(schema: Any, path: str = "$") -> str | None:
    """Why ``schema`` breaks OpenAI's strict mode (``"strict": true``), or None: every object
    that lists properties must require all of them (an optional field is made nullable
    instead) and allow no others (``additionalProperties`` absent or false)."""
    if not isinstance(schema, dict):
        return None
    if "properties" in schema and _may_be_object(schema):
        properties, required = schema["properties"], schema.get("required", [])
        if not isinstance(properties, dict):
            return f"{path}.properties must be an object, not {properties!r}"
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            return f"{path}.required must be a list of property names, not {required!r}"
        extra = schema.get("additionalProperties", False)
        if extra is not False:
            return f"{path}: additionalProperties must be false in strict mode, not {extra!r}"
        missing = [name for name in properties if name not in required]
        if missing:
            return (
                f"{path}: strict mode requires every property, but {missing[0]!r} is not in "
                '\'required\' (make it nullable, e.g. "type": ["string", "null"], instead)'
            )
    for key, value in schema.items():
        if key in _MAPS and isinstance(value, dict):
            subs = [(f"{path}.{key}.{name}", sub) for name, sub in value.items()]
        elif key in (*_LISTS, "allOf") and isinstance(value, list):
            subs = [(f"{path}.{key}[{i}]", sub) for i, sub in enumerate(value)]
        elif key in _ONE:
            subs = [(f"{path}.{key}", value)]
        else:
            continue
        for sub_path, sub in subs:
            if (problem := strict_problem(sub, sub_path)) is not None:
                return problem
    return None
