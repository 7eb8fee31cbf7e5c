"""Plugin discovery and loading.

Built-in plugins (the core's own models, caches and samplers) load first, then every entry
point of the ``pace`` group. A plugin that fails to import or register is reported and
skipped; the rest keep working. Environment:

- ``PACE_DISABLE_PLUGINS=a,b`` skips plugins by name.
- ``PACE_DISABLE_PLUGIN_AUTOLOAD=1`` skips entry points; only built-ins and the modules named
  in ``PACE_PLUGINS=pkg.module,...`` load.
"""

from __future__ import annotations

import importlib
import importlib.metadata as metadata
import logging
import os
import threading
import traceback
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import pluggy

from pace_core import hookspecs
from pace_core.registry import (
    BuildRegistry,
    CacheRegistry,
    ModelRegistry,
    OpRegistry,
    SamplerRegistry,
)

log = logging.getLogger("pace.plugins")

ENTRY_POINT_GROUP = "pace"
BUILTIN_PLUGINS = (
    ("pace.models", "pace_core.builtin.models"),
    ("pace.caches", "pace_core.builtin.caches"),
    ("pace.samplers", "pace_core.builtin.samplers"),
)


@dataclass
class PluginInfo:
    """What ``pace plugins`` shows about one plugin."""

    name: str
    origin: str  # "builtin", "entry point", "PACE_PLUGINS" or "registered"
    module: str
    distribution: str = ""
    version: str = ""
    status: str = "ok"  # "ok", "failed", "disabled"
    error: str = ""
    provides: dict[str, int] = field(default_factory=dict)


def _env_list(name: str) -> set[str]:
    return {p.strip() for p in os.environ.get(name, "").split(",") if p.strip()}


class PluginHost:
    """Owns the pluggy manager and the registries filled by the plugins' hooks."""

    def __init__(self, *, autoload: bool | None = None) -> None:
        self.pm = pluggy.PluginManager(hookspecs.PROJECT_NAME)
        self.pm.add_hookspecs(hookspecs)
        self.ops = OpRegistry()
        self.caches = CacheRegistry()
        self.models = ModelRegistry()
        self.samplers = SamplerRegistry()
        self.builds = BuildRegistry()
        self.plugins: dict[str, PluginInfo] = {}
        if autoload is None:
            autoload = os.environ.get("PACE_DISABLE_PLUGIN_AUTOLOAD", "") in ("", "0")
        self._disabled = _env_list("PACE_DISABLE_PLUGINS")
        for name, module in BUILTIN_PLUGINS:
            self._load_module(name, module, origin="builtin")
        if autoload:
            self._load_entry_points()
        for module in sorted(_env_list("PACE_PLUGINS")):
            self._load_module(module, module, origin="PACE_PLUGINS")

    # -- loading ---------------------------------------------------------------------------
    def _load_entry_points(self) -> None:
        for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
            if ep.name in self.plugins:
                continue
            dist = ep.dist.name if ep.dist else ""
            version = ep.dist.version if ep.dist else ""
            info = PluginInfo(ep.name, "entry point", ep.value, dist, version)
            self.plugins[ep.name] = info
            if ep.name in self._disabled:
                info.status = "disabled"
                continue
            try:
                obj = ep.load()
            except Exception as exc:
                self._fail(info, exc)
                continue
            self._register(info, obj)

    def _load_module(self, name: str, module: str, *, origin: str) -> None:
        info = PluginInfo(name, origin, module)
        self.plugins[name] = info
        if name in self._disabled:
            info.status = "disabled"
            return
        try:
            obj = importlib.import_module(module)
        except Exception as exc:
            self._fail(info, exc)
            return
        self._register(info, obj)

    def register(self, plugin: ModuleType | object, name: str | None = None) -> PluginInfo:
        """Register an in-process plugin object (module or instance with hookimpls)."""
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        info = PluginInfo(name, "registered", getattr(plugin, "__name__", repr(plugin)))
        self.plugins[name] = info
        self._register(info, plugin)
        return info

    def _fail(self, info: PluginInfo, exc: BaseException) -> None:
        info.status = "failed"
        info.error = f"{type(exc).__name__}: {exc}"
        log.warning("plugin %r skipped: %s", info.name, info.error)
        log.debug("".join(traceback.format_exception(exc)))

    def _register(self, info: PluginInfo, plugin: Any) -> None:
        try:
            self.pm.register(plugin, name=info.name)
        except Exception as exc:
            self._fail(info, exc)
            return
        self._register_builds(info)
        registries = {
            "pace_register_ops": self.ops,
            "pace_register_kv_caches": self.caches,
            "pace_register_models": self.models,
            "pace_register_samplers": self.samplers,
        }
        # Call this plugin's hooks only, staging its registrations so a failure in any hook
        # leaves no trace of it in any registry.
        called = []
        try:
            for hook_name, registry in registries.items():
                for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                    if impl.plugin_name != info.name:
                        continue
                    registry._begin(info.name)
                    called.append(registry)
                    impl.function(registry=registry)
        except Exception as exc:
            for registry in called:
                registry._rollback()
            self.pm.unregister(name=info.name)
            self._fail(info, exc)
            return
        try:  # duplicate names across plugins: check every registry before storing anything
            for registry in called:
                registry._validate()
        except Exception as exc:
            for registry in called:
                registry._rollback()
            self.pm.unregister(name=info.name)
            self._fail(info, exc)
            return
        for registry in called:
            registry._commit()
        info.provides = {
            "kernels": self.ops.count(info.name),
            "caches": self.caches.count(info.name),
            "models": self.models.count(info.name),
            "processors": self.samplers.count(info.name),
        }

    def _register_builds(self, info: PluginInfo) -> None:
        """Build steps first and on their own: they stay when the other hooks fail."""
        for impl in self.pm.hook.pace_register_builds.get_hookimpls():
            if impl.plugin_name != info.name:
                continue
            self.builds._begin(info.name)
            try:
                impl.function(registry=self.builds)
                self.builds._commit()
            except Exception as exc:
                self.builds._rollback()
                log.warning("plugin %r: build step not registered: %s", info.name, exc)


_host: PluginHost | None = None
_lock = threading.Lock()


def get_host() -> PluginHost:
    """The process-wide plugin host, loaded on first use."""
    global _host
    with _lock:
        if _host is None:
            _host = PluginHost()
        return _host


def reset_host() -> None:
    """Forget the loaded plugins (tests, or after changing PACE_* variables)."""
    global _host
    with _lock:
        _host = None
