"""Structured outputs over a varied set of schemas (optional properties, nested objects,
arrays, enums, bounded numbers, ``anyOf``, a top-level array), greedy and sampled: every
answer finishes by itself ("stop") within a budget above the schema's need, parses and
validates against the schema, and has no key the schema does not list (objects are closed
where the schema says nothing)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from pace_core.sampling.schema import closed_objects

from .conftest import MODEL_NAME, client, wait_idle

SHORT = {"type": "string", "maxLength": 16}
SCHEMAS = {
    "optional-properties": {
        "type": "object",
        "properties": {"name": SHORT, "age": {"type": "integer", "minimum": 0, "maximum": 120},
                       "email": SHORT, "nickname": SHORT},
        "required": ["name", "age"],
    },
    "nested-array-of-objects": {
        "type": "object",
        "properties": {
            "order": {
                "type": "object",
                "properties": {
                    "id": {"type": "integer", "minimum": 1, "maximum": 9999},
                    "items": {
                        "type": "array", "maxItems": 3,
                        "items": {"type": "object", "properties": {
                            "sku": {"type": "string", "maxLength": 8},
                            "qty": {"type": "integer", "minimum": 1, "maximum": 9}},
                            "required": ["sku", "qty"]},
                    },
                },
                "required": ["id", "items"],
            },
            "paid": {"type": "boolean"},
        },
        "required": ["order", "paid"],
    },
    "nothing-required": {
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 30},
                       "tags": {"type": "array", "items": SHORT, "maxItems": 4}},
    },
    "enum-and-number": {
        "type": "object",
        "properties": {"status": {"enum": ["ok", "fail", "unknown"]},
                       "score": {"type": "number", "minimum": 0, "maximum": 1}},
        "required": ["status", "score"],
    },
    "top-level-array": {
        "type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99},
        "minItems": 1, "maxItems": 5,
    },
    "any-of": {"anyOf": [
        {"type": "object", "properties": {"count": {"type": "integer", "maximum": 1000}},
         "required": ["count"]},
        SHORT,
    ]},
}  # fmt: skip
ASK = "Answer with JSON only: describe a customer order from a small shop."


@pytest.mark.slow  # 36 constrained generations (~1-2 min on 2 shared cores)
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["T0", "T1"])
@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_every_answer_finishes_parses_and_validates(server, name, temperature):
    schema = SCHEMAS[name]
    c = client(server)
    for seed in range(3):
        res = c.chat.completions.create(
            model=MODEL_NAME,
            messages=[{"role": "user", "content": ASK}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": schema}},
            max_tokens=300,
            temperature=temperature,
            seed=seed,
        )
        choice = res.choices[0]
        assert choice.finish_reason == "stop", (seed, choice.message.content)
        answer = json.loads(choice.message.content)
        jsonschema.validate(answer, schema)
        jsonschema.validate(answer, closed_objects(schema))  # no key the schema did not list
    wait_idle(server)
