"""SamplingConfig: validation messages, from_dict, generation_config merging, helpers."""

from __future__ import annotations

import math

import pytest

from pace_core.sampling.config import SamplingConfig

# (field, bad value, substring of the valid range that the message must contain)
BAD_VALUES = [
    ("max_new_tokens", 0, ">= 1"),
    ("max_new_tokens", 1.5, ">= 1"),
    ("min_new_tokens", -1, ">= 0"),
    ("do_sample", "yes", "bool"),
    ("temperature", -1.0, ">= 0"),
    ("temperature", math.nan, ">= 0"),
    ("temperature", math.inf, ">= 0"),
    ("top_k", -1, ">= 0"),
    ("top_k", 2.0, ">= 0"),
    ("top_p", 0.0, "(0, 1]"),
    ("top_p", 1.1, "(0, 1]"),
    ("min_p", -0.1, "[0, 1]"),
    ("min_p", 1.5, "[0, 1]"),
    ("repetition_penalty", 0.0, "> 0"),
    ("repetition_penalty", -1.0, "> 0"),
    ("frequency_penalty", 2.5, "[-2, 2]"),
    ("frequency_penalty", -2.5, "[-2, 2]"),
    ("presence_penalty", 3.0, "[-2, 2]"),
    ("ignore_eos", 1, "bool"),
    ("seed", -1, "[0, "),
    ("seed", 2**64, "[0, "),
    ("num_beams", 0, ">= 1"),
    ("length_penalty", math.nan, "finite"),
    ("early_stopping", "never", "bool"),
    ("logprobs", -1, "[0, 20]"),
    ("logprobs", 21, "[0, 20]"),
    ("prompt_logprobs", 100, "[0, 20]"),
]


@pytest.mark.parametrize(("field", "value", "valid"), BAD_VALUES)
def test_bad_field_message_names_field_value_and_range(field, value, valid):
    with pytest.raises(ValueError) as exc:
        SamplingConfig(**{field: value})
    msg = str(exc.value)
    assert msg.startswith(field), msg
    assert f"(got {value!r})" in msg, msg
    assert valid in msg, msg


def test_temperature_message_example():
    with pytest.raises(ValueError, match=r"^temperature must be >= 0 \(got -1\.0\)$"):
        SamplingConfig(temperature=-1.0)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"min_new_tokens": 10, "max_new_tokens": 5}, "min_new_tokens must be <= max_new_tokens=5"),
        ({"num_beams": 4, "do_sample": True}, "num_beams"),
        ({"logit_bias": {-3: 1.0}}, "logit_bias keys"),
        ({"logit_bias": {3: math.nan}}, "logit_bias[3]"),
        ({"logit_bias": {3: math.inf}}, "logit_bias[3]"),
        ({"logit_bias": [1, 2]}, "logit_bias must be a dict"),
        ({"eos_token_id": -1}, "eos_token_id"),
        ({"eos_token_id": []}, "eos_token_id"),
        ({"stop": ["ok", ""]}, "stop must be"),
        ({"stop": [3]}, "stop must be"),
    ],
)
def test_cross_field_and_container_errors(kwargs, needle):
    with pytest.raises(ValueError) as exc:
        SamplingConfig(**kwargs)
    assert needle in str(exc.value)


def test_defaults_valid_and_greedy():
    cfg = SamplingConfig()
    assert cfg.max_new_tokens == 128
    assert cfg.is_greedy
    assert SamplingConfig(do_sample=True).is_greedy is False
    # temperature 0 means greedy even with do_sample=True
    assert SamplingConfig(do_sample=True, temperature=0).is_greedy
    assert SamplingConfig(do_sample=True, temperature=0).temperature == 0.0


def test_boundary_values_accepted():
    cfg = SamplingConfig(
        top_p=1e-6,
        min_p=1.0,
        frequency_penalty=-2,
        presence_penalty=2,
        logprobs=20,
        prompt_logprobs=0,
        seed=2**64 - 1,
        min_new_tokens=128,
        logit_bias={5: -math.inf},
    )
    assert cfg.logprobs == 20


def test_normalisation():
    cfg = SamplingConfig(stop="###", logit_bias={"50256": -100, 7: 1.5}, eos_token_id=(1, 2))
    assert cfg.stop == ["###"]
    assert cfg.logit_bias == {50256: -100, 7: 1.5}
    assert cfg.eos_token_ids == (1, 2)
    assert SamplingConfig(eos_token_id=3).eos_token_ids == (3,)
    assert SamplingConfig().eos_token_ids is None


def test_from_dict_roundtrip_and_unknown_key():
    cfg = SamplingConfig.from_dict({"do_sample": True, "top_k": 5})
    assert cfg.top_k == 5 and cfg.do_sample
    assert SamplingConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ValueError) as exc:
        SamplingConfig.from_dict({"tempreature": 0.5, "bogus": 1})
    msg = str(exc.value)
    assert "'tempreature' (did you mean 'temperature'?)" in msg
    assert "'bogus'" in msg
    for name in SamplingConfig.field_names():
        assert name in msg


def test_merged_returns_new_validated_config():
    base = SamplingConfig(do_sample=True, temperature=0.7)
    new = base.merged(top_p=0.9)
    assert new.top_p == 0.9 and new.temperature == 0.7 and base.top_p == 1.0
    with pytest.raises(ValueError, match="top_p"):
        base.merged(top_p=2.0)
    with pytest.raises(ValueError, match="did you mean 'top_p'"):
        base.merged(topp=0.5)


def test_from_generation_config_merge_order():
    gen = {
        "do_sample": True,
        "temperature": 0.6,
        "top_p": 0.9,
        "eos_token_id": [128001, 128009],
        "bos_token_id": 128000,
        "pad_token_id": None,
        "transformers_version": "4.45.0",
        "max_length": 4096,
        "typical_p": 0.5,
        "top_k": None,  # null in the file = not set
    }
    cfg = SamplingConfig.from_generation_config(gen)
    assert cfg.do_sample and cfg.temperature == 0.6 and cfg.top_p == 0.9
    assert cfg.eos_token_ids == (128001, 128009)
    # keys absent from the file keep our defaults (HF's implicit top_k=50 is not injected)
    assert cfg.top_k == 0 and cfg.max_new_tokens == 128
    # explicit user values win over the file
    cfg = SamplingConfig.from_generation_config(gen, temperature=0.2, top_k=20, do_sample=False)
    assert cfg.temperature == 0.2 and cfg.top_k == 20 and not cfg.do_sample and cfg.top_p == 0.9
    assert SamplingConfig.from_generation_config(None, seed=3).seed == 3
    assert (
        SamplingConfig.from_generation_config({"early_stopping": "never"}).early_stopping is False
    )
    with pytest.raises(ValueError, match="unknown sampling parameter"):
        SamplingConfig.from_generation_config(gen, max_tokens=3)
    with pytest.raises(ValueError, match=r"top_p must be in \(0, 1\] \(got 0\.0\)"):
        SamplingConfig.from_generation_config({"top_p": 0.0})
