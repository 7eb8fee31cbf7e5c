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


def test_strict_mode_rules():
    from pace_core.sampling.schema import strict_problem

    ok = {
        "type": "object",
        "properties": {
            "a": {"type": ["string", "null"]},
            "b": {"type": "array", "items": {"properties": {"c": {}}, "required": ["c"]}},
        },
        "required": ["a", "b"],
        "additionalProperties": False,
    }
    assert strict_problem(ok) is None
    optional = {"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a"]}
    assert "'b' is not in 'required'" in strict_problem(optional)
    nested = {**ok, "properties": {**ok["properties"], "b": {"items": {"properties": {"c": {}}}}}}
    assert strict_problem(nested).startswith("$.properties.b.items:")
    opened = {**ok, "additionalProperties": True}
    assert "additionalProperties must be false" in strict_problem(opened)
