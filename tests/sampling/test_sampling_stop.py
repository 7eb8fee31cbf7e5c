"""Stop strings over streamed text, hold-back, and EOS checks."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from pace_core.sampling.stop import StopChecker, find_stop, holdback_length, is_eos


def feed_all(checker: StopChecker, chunks):
    out = []
    for c in chunks:
        upd = checker.feed(c)
        out.append(upd.text)
        if upd.stopped:
            break
    return out


def test_stop_split_across_chunks_is_trimmed():
    chk = StopChecker(["</end>"])
    assert feed_all(chk, ["Hello wor", "ld</e", "nd> trailing"]) == ["Hello wor", "ld", ""]
    assert chk.stopped and chk.stop_string == "</end>"
    assert chk.output == "Hello world"
    assert chk.feed("more").text == ""  # nothing after a stop


def test_stop_inside_one_chunk_drops_rest():
    chk = StopChecker(["\n\n"])
    upd = chk.feed("first para\n\nsecond para")
    assert upd.stopped and upd.text == "first para" and upd.stop_string == "\n\n"


def test_include_stop_string():
    chk = StopChecker(["STOP"], include_stop_str_in_output=True)
    assert "".join(feed_all(chk, ["abc S", "TO", "Pxyz"])) == "abc STOP"


def test_hold_back_and_release():
    chk = StopChecker(["###", "Observation:"])
    upd = chk.feed("answer #")
    assert upd.text == "answer " and chk.held_back == 1
    upd = chk.feed("#")
    assert upd.text == "" and chk.held_back == 2
    upd = chk.feed(" not a stop")  # "## " can no longer become "###"
    assert upd.text == "## not a stop" and chk.held_back == 0
    upd = chk.feed(" Observ")
    assert upd.text == " " and chk.held_back == len("Observ")
    assert chk.flush() == "Observ"  # generation ended by EOS: release the tail
    assert chk.output == "answer ## not a stop Observ" and not chk.stopped


def test_first_completed_stop_wins():
    chk = StopChecker(["abc", "b"])
    upd = chk.feed("xab")  # "b" is complete although "abc" could still follow
    assert upd.stopped and upd.text == "xa" and upd.stop_string == "b"
    assert find_stop("zzabcz", ["bc", "abc"]) == (2, "abc")
    assert find_stop("zz", ["a"]) is None


def test_no_stop_strings_streams_everything():
    chk = StopChecker(None)
    assert feed_all(chk, ["a", "b"]) == ["a", "b"]
    assert chk.held_back == 0 and chk.flush() == ""


def test_holdback_length():
    assert holdback_length("hello <", ["<|im_end|>"]) == 1
    assert holdback_length("hello <|im_", ["<|im_end|>"]) == 5
    assert holdback_length("hello", ["<|im_end|>"]) == 0
    assert holdback_length("aa", ["aab", "ab"]) == 2
    assert holdback_length("x", []) == 0
    assert holdback_length("ab", ["ab"]) == 0  # a full match is find_stop's job
    assert holdback_length("xa", ["ab"]) == 1
    assert holdback_length("abc", ["c"]) == 0


def test_is_eos():
    assert is_eos(2, {2, 3})
    assert is_eos(2, 2)
    assert not is_eos(4, [2, 3])
    assert not is_eos(2, {2}, ignore_eos=True)
    assert not is_eos(2, None)


@settings(max_examples=150, deadline=None)
@given(
    text=st.text(alphabet="ab#X", max_size=40),
    cuts=st.lists(st.integers(0, 40), max_size=8),
    stops=st.lists(st.text(alphabet="ab#", min_size=1, max_size=4), min_size=1, max_size=3),
)
def test_streaming_equals_whole_text(text, cuts, stops):
    """Any chunking gives the same output as cutting the full text at the first stop."""
    bounds = sorted({0, len(text), *[c for c in cuts if c <= len(text)]})
    chunks = [text[a:b] for a, b in itertools.pairwise(bounds)]
    chk = StopChecker(stops)
    emitted = "".join(feed_all(chk, chunks))
    if not chk.stopped:
        emitted += chk.flush()
    # reference: earliest end of a stop string, then its earliest start among those ending there
    ends = [(text.find(s) + len(s), text.find(s)) for s in stops if s in text]
    if ends:
        end = min(e for e, _ in ends)
        # the streamed checker sees text up to the chunk containing ``end``: the stop found
        # there is the earliest-starting one within that prefix
        chunk_end = next(b for b in bounds if b >= end)
        hit = find_stop(text[:chunk_end], stops)
        assert hit is not None
        assert chk.stopped and emitted == text[: hit[0]]
    else:
        assert not chk.stopped and emitted == text
