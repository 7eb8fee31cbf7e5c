"""Object schemas closed by default: the rules of pace_core.sampling.schema."""

from __future__ import annotations

from pace_core.sampling.schema import closed_objects


def test_objects_with_properties_are_closed_everywhere_they_nest():
    schema = {
        "type": "object",
        "properties": {
            "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
            "b": {"type": "array", "items": {"properties": {"y": {}}}},
            "c": {"anyOf": [{"type": "object", "properties": {"z": {}}}, {"type": "null"}]},
        },
        "$defs": {"D": {"type": ["object", "null"], "properties": {"w": {}}}},
    }
    out = closed_objects(schema)
    assert out["additionalProperties"] is False
    assert out["properties"]["a"]["additionalProperties"] is False
    assert out["properties"]["b"]["items"]["additionalProperties"] is False
    assert out["properties"]["c"]["anyOf"][0]["additionalProperties"] is False
    assert out["$defs"]["D"]["additionalProperties"] is False
    assert "additionalProperties" not in schema  # the caller's schema is not changed


def test_what_stays_open():
    free = {"type": "object"}  # no properties: any object
    said = {"type": "object", "properties": {"a": {}}, "additionalProperties": True}
    typed = {"properties": {"a": {}}, "additionalProperties": {"type": "integer"}}
    composed = {"properties": {"a": {}}, "allOf": [{"properties": {"b": {}}}]}
    not_object = {"type": "string", "properties": {"a": {}}}
    for schema in (free, said, typed, not_object):
        assert closed_objects(schema) == schema
    out = closed_objects(composed)
    assert "additionalProperties" not in out
    assert "additionalProperties" not in out["allOf"][0]
