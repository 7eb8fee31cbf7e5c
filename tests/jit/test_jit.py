"""pace_core.jit without compiling: cache directories, flags, the failure record and the lock."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from pace_core import jit, jit_cache, registry
from pace_core.cpu import detect_cpu


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PACE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("CXX", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def source(tmp_path):
    path = tmp_path / "kernel.cpp"
    path.write_text("int f() { return 1; }\n")
    return path


def test_directory_is_isa_tagged_and_hashes_every_input(cache, source, tmp_path):
    ext = jit.Extension("pace_probe", [source], isa_tag="avx2", prefix="probe")
    assert ext.directory.parent == cache / "kernels" == jit.kernels_dir()
    assert ext.directory.name.startswith(f"probe-avx2-torch{torch.__version__}-")
    assert jit.Extension("pace_probe", [source], isa_tag="avx2", prefix="probe") == ext
    assert jit.Extension("pace_probe", [source], prefix="probe").isa_tag == detect_cpu().isa_level
    others = [
        jit.Extension("pace_probe", [source], isa_tag="avx512", prefix="probe"),
        jit.Extension("pace_probe", [source], isa_tag="avx2", prefix="probe", extra_cflags=["-DX"]),
        jit.Extension("pace_probe", [source], isa_tag="avx2", prefix="probe", hash_extra=["v2"]),
    ]
    header = tmp_path / "kernel.h"
    header.write_text("#pragma once\n")
    others.append(
        jit.Extension("pace_probe", [source], isa_tag="avx2", prefix="probe", headers=[header])
    )
    before = ext.directory
    source.write_text("int f() { return 2; }\n")  # an edited source never meets a stale build
    others.append(jit.Extension("pace_probe", [source], isa_tag="avx2", prefix="probe"))
    dirs = {before, *(o.directory for o in others)}
    assert len(dirs) == 1 + len(others)


def test_openmp_reaches_compiler_and_linker(source):
    ext = jit.Extension(
        "pace_probe", [source], isa_tag="x", library_dirs=["/opt/lib"], libraries=[":libfoo.so.3"]
    )
    assert ext.cflags == ["-O3", "-fopenmp"]
    assert ext.ldflags == ["-fopenmp", "-L/opt/lib", "-Wl,-rpath,/opt/lib", "-l:libfoo.so.3"]
    own = jit.Extension("pace_probe", [source], isa_tag="x", extra_cflags=["-O2", "-fopenmp"])
    assert own.cflags == ["-O2", "-fopenmp"]


def test_vocabulary():
    assert jit.BuildNotApplicable is registry.BuildNotApplicable
    failed = jit.BuildFailed("why\ndetail", log="tail")
    assert isinstance(failed, RuntimeError) and failed.log == "tail" and failed.directory is None


def test_no_compiler_is_a_reason_not_a_crash(cache, source, monkeypatch):
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    ext = jit.Extension("pace_probe", [source], isa_tag="x", what="the probe", backend="probe")
    with pytest.raises(jit.BuildFailed, match="cannot build the probe: no C.. compiler"):
        ext.check()
    with pytest.raises(jit.BuildFailed, match="no C.. compiler"):
        ext.load()
    assert not ext.directory.exists()  # nothing was attempted


def test_earlier_failure_fails_fast_until_retried(cache, source):
    ext = jit.Extension("pace_probe", [source], isa_tag="x", what="the probe", backend="probe")
    ext.directory.mkdir(parents=True)
    ext.failure_record.write_text("ninja noise\nkernel.cpp:1:1: error: simulated\n\nfull log")
    reason = ext.failure()
    assert reason == (
        "JIT build of the probe failed earlier: kernel.cpp:1:1: error: simulated "
        f"(log: {ext.failure_record}; run `pace build-kernels probe` or delete it to retry)"
    )
    with pytest.raises(jit.BuildFailed) as failed:
        ext.load()
    assert str(failed.value) == reason and failed.value.directory == ext.directory


def test_lazy_extension_remembers_a_failure_and_retries_on_prebuild(cache, source):
    calls = []

    def describe():
        calls.append(1)
        if len(calls) <= 2:
            raise jit.BuildFailed("libfoo not found")
        raise jit.BuildNotApplicable("this CPU has no foo")

    lazy = jit.LazyExtension(describe)
    assert lazy.unavailable() == "libfoo not found"
    assert lazy.unavailable() == "libfoo not found" and len(calls) == 1  # remembered
    with pytest.raises(jit.BuildFailed, match="libfoo"):
        lazy.check()  # registration looks again (a later process would)
    lazy.check()  # not applicable here: registration goes ahead, the resolver declines
    with pytest.raises(jit.BuildNotApplicable):
        lazy.prebuild()
    assert not lazy.loaded


def test_a_second_process_waits_for_the_build_lock(cache, source):
    """While one process builds, another waits, then uses that outcome (compiling nothing)."""
    ext = jit.Extension("pace_lock_probe", [source], isa_tag="x", what="the probe")
    ext.directory.mkdir(parents=True)
    code = (
        "import sys\nfrom pace_core import jit\n"
        f"try:\n    jit.build_extension('pace_lock_probe', [{str(source)!r}], isa_tag='x', "
        "what='the probe')\nexcept jit.BuildFailed as exc:\n    print(exc)\n"
    )
    with open(ext.directory / jit.LOCK_FILE, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        child = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=os.environ.copy(),
        )
        try:
            ready, _, _ = select.select([child.stderr], [], [], 120)
            assert ready, "the second process neither waited nor finished"
            assert "waiting for another process building the probe" in child.stderr.readline()
            ext.failure_record.write_text("kernel.cpp:1:1: error: failed in the first process\n")
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
        out, err = child.communicate(timeout=120)
    assert "failed earlier: kernel.cpp:1:1: error: failed in the first process" in out
    assert "compiling" not in err


def _fake_build(kernels: Path, name: str, age: float) -> Path:
    """A finished build directory last used ``age`` seconds ago."""
    d = kernels / name
    d.mkdir(parents=True)
    (d / jit.BUILT_FILE).write_text("lib.so\n")
    when = time.time() - age
    os.utime(d / jit.BUILT_FILE, (when, when))
    return d


def test_a_new_build_retires_the_older_builds_of_its_family_only(cache):
    kernels = cache / "kernels"
    family = "probe-avx2-torch2.13.0+cpu"
    old = [_fake_build(kernels, f"{family}-{i:012x}", age=100 * (i + 1)) for i in range(5)]
    other_target = _fake_build(kernels, "probe-avx512-torch2.13.0+cpu-0000000000aa", age=900)
    not_a_build = _fake_build(kernels, f"{family}-notahash", age=900)
    new = _fake_build(kernels, f"{family}-ffffffffffff", age=0)
    jit_cache.mark_used(old[3], jit.BUILT_FILE)  # the 4th oldest was just loaded again
    removed = jit_cache.prune_older_builds(new, jit.BUILT_FILE, jit.LOCK_FILE)
    kept = {new, old[3], old[0]}  # this build and the two most recently used before it
    assert set(removed) == set(old) - kept
    assert all(d.exists() for d in (*kept, other_target, not_a_build))
    assert not any(d.exists() for d in removed)


def test_a_build_in_progress_is_never_removed(cache):
    kernels = cache / "kernels"
    family = "probe-avx2-torch2.13.0+cpu"
    busy = _fake_build(kernels, f"{family}-{1:012x}", age=500)
    idle = _fake_build(kernels, f"{family}-{2:012x}", age=400)
    new = _fake_build(kernels, f"{family}-{3:012x}", age=0)
    with open(busy / jit.LOCK_FILE, "w") as handle:  # another build holds its lock
        fcntl.flock(handle, fcntl.LOCK_EX)
        removed = jit_cache.prune_older_builds(new, jit.BUILT_FILE, jit.LOCK_FILE, keep=1)
    assert removed == [idle] and busy.exists() and new.exists()
