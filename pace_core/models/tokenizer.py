"""A model directory's tokenizer, as ``AutoTokenizer`` gives it, at a fraction of the memory.

transformers 5 rebuilds a tokenizer whose class has its own ``__init__`` (Gemma, Llama, Qwen2,
GPT-2, ...) from the vocabulary and merges of ``tokenizer.json`` parsed in Python (and keeps
them), reads the whole file again for its added tokens when ``tokenizer_config.json`` does not
list them, and the Rust ``tokenizers`` library buffers merges stored as pairs (``["a", "b"]``)
through generic values. For Gemma 3 (262k tokens, 515k merges): +484 MB of peak RSS, +281 MB
kept. Loaded here instead:

- ``tokenizer.json`` is converted once, in a child process (its transient memory never touches
  this one), under ``$PACE_CACHE_DIR/tokenizers/``: a copy with the merges as strings
  (``"a b"``, the format ``tokenizers`` also reads; only when no merge part holds a space), its
  added tokens, and a skeleton without vocabulary, merges or added tokens;
- for a BPE model whose ``tokenizer_config.json`` names a class that adds no methods of its
  own (only an ``__init__``), that class is built over the skeleton (milliseconds: the probe),
  and the generic ``TokenizersBackend`` over the converted file, with the added tokens passed
  in and the probe's padding side, truncation side and input names. That one is the tokenizer
  when both have the same normalizer, pre-tokenizer, post-processor and decoder and the
  probe's BPE options are the file's (what the class rebuilds is what the file says).
  Otherwise it is ``AutoTokenizer.from_pretrained`` as it is.

Gemma 3: +196 MB peak, +119 MB kept, 2.1-2.5 s instead of 3.6-4.5 s; SmolLM2: +33 / +25 MB
instead of +155 / +110. Same ids, decoding, special tokens and chat template (tested). Where
the cache cannot be written it is ``AutoTokenizer`` too.

Run as a script (``python tokenizer.py SOURCE DEST_DIR``) this module is the child's
conversion; its top level imports the standard library only.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

FORMAT = 1  # of a cache entry: a new format gets new entries
TOKENIZER_FILE = "tokenizer.json"
ADDED_TOKENS_FILE = "added_tokens.json"  # the source's "added_tokens" entries, as a list
SKELETON_FILE = "skeleton.json"  # the source without vocabulary, merges and added tokens
PIPELINE = ("normalizer", "pre_tokenizer", "post_processor", "decoder")
INSTANCE_DEFAULTS = ("padding_side", "truncation_side", "model_input_names")
_METHODS = (types.FunctionType, staticmethod, classmethod, property)


def compact(source: Path, dest: Path) -> None:
    """Write ``dest``'s added tokens and skeleton and, when the merges are pairs none of whose
    parts holds a space, ``dest/tokenizer.json`` with the merges as ``"a b"`` strings (else no
    copy: the source is read as it is)."""
    data = _read(source)
    dest.mkdir(parents=True, exist_ok=True)
    model = data.get("model") or {}
    merges = model.get("merges")
    pairs = isinstance(merges, list) and merges and all(isinstance(m, list) for m in merges)
    if pairs and not any(" " in part for pair in merges for part in pair):
        model["merges"] = [" ".join(pair) for pair in merges]
        _write(dest / TOKENIZER_FILE, data)
    _write(dest / ADDED_TOKENS_FILE, data.get("added_tokens", []))
    model |= {k: type(model[k])() for k in ("vocab", "merges") if k in model}
    _write(dest / SKELETON_FILE, data | {"model": model, "added_tokens": []})


def _write(file: Path, value: Any) -> None:
    with open(file, "w", encoding="utf-8") as f:
        json.dump(value, f, ensure_ascii=False)


def _read(file: Path) -> Any:
    with open(file, encoding="utf-8") as f:
        return json.load(f)


def prepared(source: Path) -> Path | None:
    """The cache entry of ``source`` (:func:`compact`), converted once per source (path, size
    and modification time) by a child process; None where the cache cannot be written."""
    from pace_core.paths import derived_entry

    entry = derived_entry("tokenizers", source, f"{source.resolve().parent.name}-v{FORMAT}")
    if (entry / SKELETON_FILE).is_file():
        return entry
    staging = entry.with_name(f"{entry.name}.{os.getpid()}.partial")
    try:
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
    except OSError:  # a read-only cache
        return None
    done = subprocess.run(
        [sys.executable, __file__, str(source), str(staging)], capture_output=True, text=True
    )
    if done.returncode != 0:
        from pace_core.errors import ModelLoadError

        shutil.rmtree(staging, ignore_errors=True)
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise ModelLoadError(f"cannot read the tokenizer file {source}: {last}")
    if entry.is_dir() and not (entry / SKELETON_FILE).is_file():  # a conversion cut short
        shutil.rmtree(entry, ignore_errors=True)
    try:
        staging.rename(entry)
    except OSError:  # another process converted it first
        shutil.rmtree(staging, ignore_errors=True)
    return entry


def load(path: Path) -> Any:
    """The tokenizer of model directory ``path`` (see the module docstring)."""
    from transformers import AddedToken, AutoTokenizer, TokenizersBackend

    source = path / TOKENIZER_FILE
    config_file = path / "tokenizer_config.json"
    config = _read(config_file) if config_file.is_file() else {}
    cls = _named_class(config)
    if cls is None or not source.is_file():
        return AutoTokenizer.from_pretrained(str(path))
    entry = prepared(source)
    if entry is None:
        return AutoTokenizer.from_pretrained(str(path))
    skeleton = entry / SKELETON_FILE
    model = _read(skeleton).get("model", {})
    if model.get("type") != "BPE":
        return AutoTokenizer.from_pretrained(str(path))  # nothing to gain: no merges
    kwargs: dict[str, Any] = {}
    if "added_tokens_decoder" not in config:
        kwargs["added_tokens_decoder"] = {
            t["id"]: AddedToken(**{k: v for k, v in t.items() if k != "id"})
            for t in _read(entry / ADDED_TOKENS_FILE)
        }
    probe = cls.from_pretrained(str(path), tokenizer_file=str(skeleton), **kwargs)
    file = entry / TOKENIZER_FILE
    kwargs |= {a: getattr(probe, a) for a in INSTANCE_DEFAULTS}
    tokenizer = TokenizersBackend.from_pretrained(
        str(path), tokenizer_file=str(file if file.is_file() else source), **kwargs
    )
    probe_model = json.loads(probe.backend_tokenizer.to_str())["model"]
    if _pipeline(probe) == _pipeline(tokenizer) and _options(probe_model) == _options(model):
        return tokenizer
    del tokenizer  # not what the class builds: the reference load, without it alongside
    return AutoTokenizer.from_pretrained(str(path))


def _named_class(config: dict[str, Any]) -> type | None:
    """The class ``tokenizer_config.json`` names, when it is a ``TokenizersBackend`` that adds
    no methods of its own (and no remote code is named); else None."""
    from transformers import TokenizersBackend
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    name = config.get("tokenizer_class")
    if not isinstance(name, str) or "auto_map" in config:
        return None
    cls = tokenizer_class_from_name(name)
    if not (isinstance(cls, type) and issubclass(cls, TokenizersBackend)):
        return None
    return None if _methods_of_its_own(cls) else cls


def _methods_of_its_own(cls: type) -> set[str]:
    """What ``cls`` defines over ``TokenizersBackend`` besides ``__init__``."""
    from transformers import TokenizersBackend

    own = cls.__mro__[: cls.__mro__.index(TokenizersBackend)]
    methods = {k for klass in own for k, v in vars(klass).items() if isinstance(v, _METHODS)}
    return methods - {"__init__"}


def _pipeline(tokenizer: Any) -> list[bytes | None]:
    """The serialized normalizer, pre-tokenizer, post-processor and decoder of ``tokenizer``."""
    backend = tokenizer.backend_tokenizer
    parts = (getattr(backend, name) for name in PIPELINE)
    return [None if part is None else part.__getstate__() for part in parts]


def _options(model: dict[str, Any]) -> dict[str, Any]:
    """A BPE model's serialized options: all but its vocabulary and merges."""
    return {k: v for k, v in model.items() if k not in ("vocab", "merges")}


if __name__ == "__main__":
    compact(Path(sys.argv[1]), Path(sys.argv[2]))
