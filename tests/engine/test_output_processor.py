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
    out = OutputProcessor(None)
    out.start("a", SamplingConfig(stop=["x"]))
    events, stopped = out.process(tokens("a", [1, 2], last_reason="length"))
    assert [(e.token, e.text, e.finish_reason) for e in events] == [(1, "", None),
                                                                   (2, "", "length")]
    assert stopped == [] and out.process(tokens("a", [3])) == ([], [])
