"""The suite runs on a pace cache of its own (tests/support/session_cache.py): what it derives
from its temporary model files never reaches the user's cache."""

from __future__ import annotations

from support.session_cache import session_cache

from pace_core.paths import cache_root, derived_entry


def test_this_session_runs_on_its_own_cache():
    root = cache_root()
    assert root.name == "pace" and root.parent.name.startswith("pace-test-cache-")
    assert (root / "kernels").is_symlink() and (root / "models").is_symlink()


def test_derived_entries_stay_in_the_session(tmp_path, monkeypatch):
    user = tmp_path / "user"
    (user / "gguf-meta" / "old-entry").mkdir(parents=True)
    (user / "gguf-meta" / "old-entry" / "config.json").write_text("{}")
    (user / "random" / "llama").mkdir(parents=True)
    session = session_cache(user, tmp_path / "session" / "pace")
    # made where pace's own first run makes them
    made = {"kernels", "models"}
    before = {str(p.relative_to(user)) for p in user.rglob("*")}
    assert made <= before
    assert (session / "kernels").resolve() == (user / "kernels").resolve()
    # what exists is read in place, what does not stays absent
    assert (session / "random" / "llama").is_dir() and not (session / "peers").exists()
    assert (session / "gguf-meta" / "old-entry" / "config.json").read_text() == "{}"

    source = tmp_path / "model.gguf"
    source.write_bytes(b"GGUF")
    monkeypatch.setenv("PACE_CACHE_DIR", str(session))
    entry = derived_entry("gguf-meta", source, "model")
    entry.mkdir()
    (entry / "config.json").write_text("{}")
    assert entry.parent == session / "gguf-meta"
    assert {str(p.relative_to(user)) for p in user.rglob("*")} == before
