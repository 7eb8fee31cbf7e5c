"""Structured outputs offline: SamplingConfig(json_schema=..., grammar=...) in LLMModel.generate.

Numbers and strings are bounded in the schemas: an unbounded integer lets a 135M model write
digits until max_new_tokens (finish_reason "length"), which is the schema's doing, not the
grammar engine's.

Bar: every output of a varied set of schemas (nested objects, arrays, enums, required fields,
patterns) parses and validates at temperature 0 and 1, in one mixed batch; unconstrained rows
of the same batch are unaffected; bad schemas and impossible combinations are clear errors.
"""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from pace_core.engine.llm import LLMModel
from pace_core.errors import ConfigError
from pace_core.sampling import SamplingConfig
from pace_core.sampling.grammar import apply_bitmask, bitmask_words

SCHEMAS = {
    "nested": {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 24},
            "address": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 24},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
                },
                "required": ["city", "zip"],
                "additionalProperties": False,
            },
        },
        "required": ["name", "address"],
        "additionalProperties": False,
    },
    "array": {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 100},
        "minItems": 1,
        "maxItems": 5,
    },
    "enum": {
        "type": "object",
        "properties": {
            "color": {"enum": ["red", "green", "blue"]},
            "ok": {"type": "boolean"},
            "score": {"type": "integer", "minimum": -5, "maximum": 5},
        },
        "required": ["color", "ok", "score"],
        "additionalProperties": False,
    },
    "list-of-objects": {
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer", "minimum": 0, "maximum": 9999},
                        "tag": {"enum": ["a", "b"]},
                    },
                    "required": ["id", "tag"],
                    "additionalProperties": False,
                },
            }
        },
        "required": ["items"],
        "additionalProperties": False,
    },
}
PROMPT = [{"role": "user", "content": "Answer with a JSON record describing a person."}]


@pytest.fixture(scope="module")
def llm(smollm2_dir):
    return LLMModel(smollm2_dir, dtype=torch.float32, quiet=True)


def test_every_output_parses_and_validates_at_temperature_0_and_1(llm):
    configs, schemas = [], []
    for schema in SCHEMAS.values():
        for temperature, seed in [(0.0, None), (1.0, 1), (1.0, 2), (1.0, 3)]:
            configs.append(
                SamplingConfig(
                    max_new_tokens=200,
                    do_sample=temperature > 0,
                    temperature=temperature,
                    seed=seed,
                    json_schema=schema,
                )
            )
            schemas.append(schema)
    out = llm.generate([PROMPT] * len(configs), configs)
    for seq, schema in zip(out.sequences, schemas):
        assert seq.finish_reason == "stop", seq.text
        jsonschema.validate(json.loads(seq.text), schema)


def test_json_object_and_schema_as_json_text(llm):
    cfg = SamplingConfig(max_new_tokens=120, json_schema='{"type": "object"}')
    ask = [{"role": "user", "content": "Give the capital of France as JSON."}]
    text = llm.generate([ask], cfg).sequences[0].text
    assert isinstance(json.loads(text), dict), text


def test_lark_grammar_with_a_regex(llm):
    cfg = SamplingConfig(
        max_new_tokens=20, do_sample=True, seed=5, grammar="start: /[0-9]{3}-[0-9]{4}/"
    )
    for seq in llm.generate([PROMPT] * 3, cfg).sequences:
        assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", seq.text), seq.text
        assert seq.finish_reason == "stop"


def test_unconstrained_rows_of_a_mixed_batch_are_unaffected(llm):
    free = SamplingConfig(max_new_tokens=16)
    alone = llm.generate([PROMPT], free).sequences[0].token_ids
    constrained = SamplingConfig(max_new_tokens=16, json_schema=SCHEMAS["enum"])
    mixed = llm.generate([PROMPT, PROMPT], [constrained, free])
    assert mixed.sequences[1].token_ids == alone
    assert mixed.sequences[0].token_ids != alone


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"json_schema": "{not json"}, "not valid JSON"),
        ({"json_schema": [1, 2]}, "JSON schema object"),
        ({"json_schema": {}, "grammar": "start: /a/"}, "not both"),
        ({"grammar": "  "}, "non-empty"),
        ({"json_schema": {}, "ignore_eos": True}, "ignore_eos"),
        ({"json_schema": {}, "min_new_tokens": 2}, "min_new_tokens"),
        ({"json_schema": {}, "num_beams": 2}, "num_beams"),
    ],
)
def test_config_errors_name_the_problem(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SamplingConfig(**kwargs)


def test_invalid_schema_and_grammar_are_config_errors(llm):
    with pytest.raises(ConfigError, match="json_schema is not a valid grammar.*foo"):
        llm.generate([PROMPT], SamplingConfig(json_schema={"type": "foo"}))
    with pytest.raises(ConfigError, match="grammar is not a valid grammar"):
        llm.generate([PROMPT], SamplingConfig(grammar="start: undefined_rule"))


def test_a_schema_past_the_grammar_engines_limits_raises_offline(llm):
    """3000 optional properties outgrow llguidance's parser after the first ``{``: generate
    raises naming the prompt, never returns that row as a normal stop."""
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(3000)}}
    cfg = SamplingConfig(json_schema=schema, max_new_tokens=6)
    with pytest.raises(ConfigError, match="prompt 0: the structured-output grammar engine gave up"):
        llm.generate([PROMPT], cfg)


def test_needs_a_tokenizer_and_no_speculation(smollm2_dir):
    bare = LLMModel(smollm2_dir, dtype=torch.float32, load_tokenizer=False, quiet=True)
    with pytest.raises(ConfigError, match="need a tokenizer"):
        bare.generate([[1, 2, 3]], SamplingConfig(json_schema={"type": "object"}))
    spec = LLMModel(
        smollm2_dir,
        dtype=torch.float32,
        quiet=True,
        spec_config={"method": "prompt_lookup", "num_speculative_tokens": 3},
    )
    with pytest.raises(ConfigError, match="speculative decoding"):
        spec.generate([PROMPT], SamplingConfig(json_schema={"type": "object"}))


@pytest.mark.parametrize("vocab", [1, 31, 32, 33, 1000, 49152])
def test_apply_bitmask_matches_a_per_token_reference(vocab):
    gen = torch.Generator().manual_seed(vocab)
    rows = 3
    words = bitmask_words(vocab)
    mask = torch.randint(-(2**31), 2**31 - 1, (rows, words), generator=gen, dtype=torch.int64)
    mask = mask.to(torch.int32)
    logits = torch.randn(rows, vocab, generator=gen)
    expected = logits.clone()
    for r in range(rows):
        for t in range(vocab):
            if not (int(mask[r, t // 32]) >> (t % 32)) & 1:
                expected[r, t] = float("-inf")
    apply_bitmask(logits, mask)
    assert torch.equal(logits, expected)


MORE_SCHEMAS = {
    "any-of": {
        "type": "object",
        "properties": {
            "value": {
                "anyOf": [
                    {"type": "integer", "minimum": 0, "maximum": 10**6},
                    {"type": "string", "maxLength": 12},
                ]
            },
            "kind": {"const": "measurement"},
        },
        "required": ["value", "kind"],
        "additionalProperties": False,
    },
    "refs": {
        "$defs": {
            "point": {
                "type": "object",
                "properties": {
                    "x": {"type": "integer", "minimum": -99, "maximum": 99},
                    "y": {"type": "integer", "minimum": -99, "maximum": 99},
                },
                "required": ["x", "y"],
                "additionalProperties": False,
            }
        },
        "type": "object",
        "properties": {"a": {"$ref": "#/$defs/point"}, "b": {"$ref": "#/$defs/point"}},
        "required": ["a", "b"],
        "additionalProperties": False,
    },
    "bounded-numbers": {
        "type": "object",
        "properties": {
            "price": {"type": "number", "minimum": 0, "maximum": 1000},
            "count": {"type": "integer", "minimum": 1, "maximum": 9},
            "in_stock": {"type": "boolean"},
        },
        "required": ["price", "count", "in_stock"],
        "additionalProperties": False,
    },
    "nested-arrays": {
        "type": "object",
        "properties": {
            "grid": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "array",
                    "maxItems": 3,
                    "items": {"type": "integer", "minimum": 0, "maximum": 9},
                },
            }
        },
        "required": ["grid"],
        "additionalProperties": False,
    },
    "optional-fields": {
        "type": "object",
        "properties": {
            "title": {"type": "string", "maxLength": 30},
            "subtitle": {"type": "string", "maxLength": 30},
            "year": {"type": "integer", "minimum": 1900, "maximum": 2100},
        },
        "required": ["title"],
        "additionalProperties": False,
    },
    "pattern-and-enum-list": {
        "type": "object",
        "properties": {
            "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"},
            "days": {
                "type": "array",
                "maxItems": 4,
                "items": {"enum": ["mon", "tue", "wed", "thu", "fri"]},
            },
        },
        "required": ["code", "days"],
        "additionalProperties": False,
    },
}


@pytest.mark.slow
def test_more_schemas_validate_over_many_samples(llm):
    """10 schemas x (greedy + 6 seeds at temperature 1) = 70 outputs, all valid."""
    schemas = {**SCHEMAS, **MORE_SCHEMAS}
    configs, wanted = [], []
    for schema in schemas.values():
        for seed in [None, *range(6)]:
            configs.append(
                SamplingConfig(
                    max_new_tokens=200, do_sample=seed is not None, seed=seed, json_schema=schema
                )
            )
            wanted.append(schema)
    out = llm.generate([PROMPT] * len(configs), configs)
    for seq, schema in zip(out.sequences, wanted):
        assert seq.finish_reason == "stop", seq.text
        jsonschema.validate(json.loads(seq.text), schema)


def test_objects_are_closed_unless_the_schema_opens_them(llm):
    """A key the schema never declared is refused; ``additionalProperties: true`` allows it."""
    from pace_core.sampling.config import SamplingConfig

    props = {"name": {"type": "string"}}
    closed = {"type": "object", "properties": props, "required": ["name"]}
    opened = {**closed, "additionalProperties": True}

    def accepts(schema, text):
        row = llm.grammar.row(SamplingConfig(json_schema=schema))
        tokens = llm.tokenizer.encode(text, add_special_tokens=False)
        return row._matcher.validate_tokens(tokens) == len(tokens)

    assert accepts(closed, '{"name":"Ada"}')  # (compact JSON: no free whitespace)
    assert not accepts(closed, '{"name":"Ada","unit_type":"x"}')
    assert accepts(opened, '{"name":"Ada","unit_type":"x"}')
