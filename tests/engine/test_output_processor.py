"""The output processor: text and stop strings of the core's tokens, off the engine loop."""

from __future__ import annotations

from pace_core.engine.events import SpecStep, Stats, Token
from pace_core.engine.output_processor import OutputProcessor
from pace_core.sampling.config import SamplingConfig

WORDS = {1: "Hello", 2: " wor", 3: "ld", 4: "!", 5: " again", 9: ""}


class Words:
    """A tokenizer whose ids are fixed strings (9 is a special token: no text)."""

    def decode(self, ids, skip_special_tokens=True):
        return "".join(WORDS[i] for i in ids)


def tokens(key, ids, last_reason=None):
    return [Token(key, t, "", last_reason if i == len(ids) - 1 else None)
            for i, t in enumerate(ids)]  # fmt: skip


def test_text_deltas_and_a_stop_string_across_tokens():
    out = OutputProcessor(Words())
    out.start("a", SamplingConfig(stop=["world"]))
    out.start("b", SamplingConfig())
    events, stopped = out.process([*tokens("a", [1, 2]), *tokens("b", [1, 2, 3]), Stats(1)])
    assert [(e.key, e.text) for e in events if isinstance(e, Token)] == [
        ("a", "Hello"), ("a", " "), ("b", "Hello"), ("b", " wor"), ("b", "ld"),
    ]  # "wor" is held back for "a": it may start "world"
    assert stopped == [] and isinstance(events[-1], Stats)
    events, stopped = out.process(tokens("a", [3, 4]))  # "ld" completes the stop string
    assert [(e.text, e.finish_reason) for e in events] == [("", "stop")]  # the "!" is dropped
    assert stopped == ["a"]
    # a token the core made before it heard of the stop is dropped
    assert out.process(tokens("a", [5])) == ([], [])


def test_the_cores_finish_releases_held_back_text():
    out = OutputProcessor(Words())
    out.start("a", SamplingConfig(stop=["world"]))
    events, stopped = out.process(tokens("a", [1, 2, 9], last_reason="stop"))  # 9: EOS
    assert "".join(e.text for e in events) == "Hello wor" and stopped == []
    assert events[-1].finish_reason == "stop"


def test_a_speculative_steps_emitted_count_is_what_was_delivered():
    out = OutputProcessor(Words())
    out.start("a", SamplingConfig(stop=["!"]))
    step = SpecStep("a", proposed=4, accepted=3, emitted=4)
    events, stopped = out.process([step, *tokens("a", [1, 4, 5, 5])])
    assert events[0] == SpecStep("a", 4, 3, 2) and stopped == ["a"]
    assert [e.token for e in events[1:]] == [1, 4]


def test_without_a_tokenizer_tokens_pass_with_no_text():
    import pytest

    from pace_core.errors import ConfigError

    out = OutputProcessor(None)
    with pytest.raises(ConfigError, match="stop strings match the text"):
        out.start("a", SamplingConfig(stop=["x"]))  # they would never match
    out.start("a", SamplingConfig())
    events, stopped = out.process(tokens("a", [1, 2], last_reason="length"))
    assert [(e.token, e.text, e.finish_reason) for e in events] == [(1, "", None),
                                                                   (2, "", "length")]
    assert stopped == [] and out.process(tokens("a", [3])) == ([], [])


def test_unfinished_utf8_counts_the_bytes_of_a_started_character():
    from pace_core.models.token_bytes import unfinished_utf8

    cat = "猫".encode()  # 3 bytes
    assert [unfinished_utf8(b"a" + cat[:n]) for n in range(4)] == [0, 1, 2, 0]
    fish = "🐟".encode()  # 4 bytes
    assert [unfinished_utf8(fish[:n]) for n in range(5)] == [0, 1, 2, 3, 0]
    assert unfinished_utf8(b"") == 0 and unfinished_utf8(b"\xbf\xbf") == 0  # no lead byte


def test_a_prompt_cut_inside_a_character_is_finished_by_the_generated_text(smollm2_dir):
    """Token ids that stop inside a character (SmolLM2 spells 🐱 with two byte tokens): the
    generated text starts with the character its tokens finish, as decoding prompt and output
    together shows (it was U+FFFD: the detokenizer did not see the prompt's bytes)."""
    import torch

    from pace_core import LLMModel

    llm = LLMModel(smollm2_dir, dtype=torch.float32, quiet=True)
    tok = llm.tokenizer
    ids = tok.encode("猫🐱 cat")[:4]  # 猫's three tokens and the first of 🐱's
    assert tok.decode(ids).endswith("\ufffd") and not tok.decode(ids[:3]).endswith("\ufffd")
    out = llm.generate([ids], SamplingConfig(max_new_tokens=5)).sequences[0]
    assert out.text == tok.decode(ids + out.token_ids)[len(tok.decode(ids[:3])) :]
    streamed = "".join(c.text for c in llm.stream([ids], SamplingConfig(max_new_tokens=5)))
    assert streamed == out.text and "\ufffd" not in out.text
