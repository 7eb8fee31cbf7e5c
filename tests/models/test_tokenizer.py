"""The lean tokenizer load (pace_core.models.tokenizer) gives what AutoTokenizer gives."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
from transformers import AutoTokenizer

from pace_core.errors import ModelLoadError
from pace_core.models import tokenizer as lean
from pace_core.quality import TEXT

SAMPLE = TEXT.read_text()[:4000] + (
    " <|im_start|>user\nhi<|im_end|> <start_of_turn>model\n ünïcödé 日本語 🙂 \t\t  x\n\n"
)
CHAT = [{"role": "user", "content": "Hello there"}, {"role": "assistant", "content": "Hi!"}]


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PACE_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture
def full_loads(monkeypatch):
    """The keyword arguments of every AutoTokenizer.from_pretrained call (lean.load makes
    none when it loads lean)."""
    calls: list[dict] = []
    real = AutoTokenizer.from_pretrained.__func__

    def spy(cls, *args, **kwargs):
        calls.append(kwargs)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(AutoTokenizer, "from_pretrained", classmethod(spy))
    return calls


def assert_same_tokenizer(ours, ref) -> None:
    enc, want = ours(SAMPLE), ref(SAMPLE)
    assert dict(enc) == dict(want)  # ids and the same input names
    ids = want["input_ids"]
    assert ours.decode(ids) == ref.decode(ids)
    assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    assert ours.convert_ids_to_tokens(ids[:50]) == ref.convert_ids_to_tokens(ids[:50])
    assert len(ours) == len(ref) and ours.all_special_tokens == ref.all_special_tokens
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "padding_side",
                 "truncation_side", "model_max_length", "chat_template"):  # fmt: skip
        assert getattr(ours, attr) == getattr(ref, attr), attr
    if ref.chat_template:
        assert ours.apply_chat_template(CHAT, tokenize=False) == ref.apply_chat_template(
            CHAT, tokenize=False
        )
    assert ours.added_tokens_decoder == ref.added_tokens_decoder


def test_smollm2_as_auto_tokenizer_gives_it(smollm2_dir, full_loads):
    ours = lean.load(smollm2_dir)
    assert not full_loads
    assert_same_tokenizer(ours, AutoTokenizer.from_pretrained(str(smollm2_dir)))
    file = lean.prepared(smollm2_dir / "tokenizer.json") / lean.TOKENIZER_FILE
    assert isinstance(json.loads(file.read_text())["model"]["merges"][0], str)
    # a second load reads the converted copy again (same entry, nothing re-converted)
    before = file.stat().st_mtime_ns
    assert_same_tokenizer(lean.load(smollm2_dir), ours)
    assert file.stat().st_mtime_ns == before


def _tiny_bpe(path, merges):
    """A BPE tokenizer.json over a few tokens (no pre-tokenizer: spaces merge too), with
    ``merges`` as given."""
    from tokenizers import Tokenizer, decoders, models

    tokens = ["<s>", "</s>", "a", "b", "c", " ", "ab", "abc", " b", "a b"]
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(tokens)}, merges=merges))
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(["<s>", "</s>"])
    path.mkdir()
    tok.save(str(path / "tokenizer.json"))
    config = {"bos_token": "<s>", "eos_token": "</s>", "tokenizer_class": "TokenizersBackend"}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def test_merges_with_a_space_are_read_from_the_source(tmp_path, full_loads):
    plain = _tiny_bpe(tmp_path / "plain", [("a", "b"), ("ab", "c")])
    spaced = _tiny_bpe(tmp_path / "spaced", [("a", "b"), ("ab", "c"), (" ", "b"), ("a", " b")])
    entry = lean.prepared(plain / "tokenizer.json")
    assert json.loads((entry / "tokenizer.json").read_text())["model"]["merges"] == ["a b", "ab c"]
    entry = lean.prepared(spaced / "tokenizer.json")
    assert not (entry / "tokenizer.json").exists()  # "a  b" would split otherwise: the source
    added = json.loads((entry / "added_tokens.json").read_text())
    assert [t["content"] for t in added] == ["<s>", "</s>"]
    for path in (plain, spaced):
        ours = lean.load(path)
        assert not full_loads  # the lean load
        ref = AutoTokenizer.from_pretrained(str(path))
        full_loads.clear()
        for text in ("abc ab a b c", "<s>abcab</s> c", "cba  abc", "a b"):
            assert ours(text)["input_ids"] == ref(text)["input_ids"], (path.name, text)


def test_a_class_that_rebuilds_another_pipeline_loads_through_auto_tokenizer(tmp_path, full_loads):
    """Llama's and GPT-2's classes rebuild pipelines (Metaspace, byte-level) this file does not
    have: the lean load must not use the file's (it would differ from AutoTokenizer), nor for
    a class with methods of its own (Cohere's tool templates)."""
    path = _tiny_bpe(tmp_path / "tiny", [("a", "b"), ("ab", "c")])
    config = json.loads((path / "tokenizer_config.json").read_text())
    for cls, generic in (("LlamaTokenizer", False), ("CohereTokenizerFast", False),
                         ("GPT2Tokenizer", False), ("PreTrainedTokenizerFast", True)):  # fmt: skip
        (path / "tokenizer_config.json").write_text(json.dumps(config | {"tokenizer_class": cls}))
        ours = lean.load(path)
        assert (not full_loads) == generic, cls
        ref = AutoTokenizer.from_pretrained(str(path))
        full_loads.clear()
        for text in ("abc ab a b c", "<s>abcab</s> c", "cba  abc", "a b"):
            assert ours(text)["input_ids"] == ref(text)["input_ids"], (cls, text)


def test_an_unwritable_cache_loads_through_auto_tokenizer(smollm2_dir, tmp_path, monkeypatch,
                                                         full_loads):  # fmt: skip
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("PACE_CACHE_DIR", str(blocker / "pace"))  # no directory can be made there
    assert lean.prepared(smollm2_dir / "tokenizer.json") is None
    assert lean.load(smollm2_dir)(SAMPLE)["input_ids"] and full_loads


def test_a_malformed_tokenizer_file_is_named(tmp_path):
    (tmp_path / "tokenizer.json").write_text('{"model": {"type": "BPE", "merges": [')
    (tmp_path / "tokenizer_config.json").write_text('{"tokenizer_class": "TokenizersBackend"}')
    with pytest.raises(ModelLoadError, match="tokenizer.json"):
        lean.load(tmp_path)
    assert not list((tmp_path.parent / "cache").rglob("*.partial"))


@pytest.mark.slow
def test_gemma3_as_auto_tokenizer_gives_it_in_a_fraction_of_the_memory(gemma3_dir, tmp_path):
    assert_same_tokenizer(lean.load(gemma3_dir), AutoTokenizer.from_pretrained(str(gemma3_dir)))
    script = textwrap.dedent(f"""
        import ctypes, json, sys
        from pathlib import Path
        def rss():
            d = dict(l.split(":", 1) for l in open("/proc/self/status"))
            return int(d["VmHWM"].split()[0]) // 1024, int(d["VmRSS"].split()[0]) // 1024
        import transformers, tokenizers
        from pace_core.models import tokenizer as lean
        base = rss()
        tok = (lean.load(Path({str(gemma3_dir)!r})) if sys.argv[1] == "lean"
               else transformers.AutoTokenizer.from_pretrained({str(gemma3_dir)!r}))
        peak = rss()[0]
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        print(json.dumps([peak - base[0], rss()[1] - base[1]]))
    """)
    used = {}
    for how in ("auto", "lean", "lean"):  # the second lean load reads the converted copy
        out = subprocess.run([sys.executable, "-c", script, how], capture_output=True, text=True,
                             check=True)  # fmt: skip
        used[how] = json.loads(out.stdout.strip().splitlines()[-1])
    # measured: auto +484 MB peak, +281 MB kept; lean +185 / +118
    assert used["lean"][0] < used["auto"][0] - 200 and used["lean"][1] < used["auto"][1] - 100
