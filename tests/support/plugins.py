"""Out-of-tree test plugins, installed for one test session only.

They are real distributions with ``pace`` entry points, but they go into a private
``--target`` directory on ``sys.path`` (and on ``PYTHONPATH`` for subprocesses), never into
the user's environment: after the suite, ``pace plugins`` lists exactly what it did before.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

PLUGIN_DIR = Path(__file__).resolve().parents[1] / "plugins"


@contextmanager
def installed_for_session(sources: Iterable[Path], target: Path) -> Iterator[Path]:
    """pip-install ``sources`` into ``target``; importable here and in child processes."""
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-build-isolation", "-q",
           "--disable-pip-version-check", "--target", str(target)]  # fmt: skip
    # Build from copies: setuptools leaves build/ and *.egg-info/ next to the sources it builds.
    copies = [shutil.copytree(src, target / ".sources" / Path(src).name) for src in sources]
    subprocess.run([*cmd, *map(str, copies)], check=True)
    old_path = os.environ.get("PYTHONPATH")
    sys.path.insert(0, str(target))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(target), old_path) if p)
    importlib.invalidate_caches()
    try:
        yield target
    finally:
        sys.path.remove(str(target))
        if old_path is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = old_path
        importlib.invalidate_caches()
