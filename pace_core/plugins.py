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
from pace_core.cpu import CpuInfo
from pace_core.errors import ContractError, PluginError
from pace_core.opconfig import OperatorConfig, OpResolver
from pace_core.ops import CONTRACT_VERSION
from pace_core.registry import (
    BuildSpec,
    CacheSpec,
    KernelSpec,
    ModelSpec,
    ProcessorSpec,
    Registrations,
    Registry,
    kernel_registry,
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
        self.ops: Registry[tuple[str, str], KernelSpec] = kernel_registry()
        self.caches: Registry[str, CacheSpec] = Registry("KV cache", lambda s: s.name)
        self.models: Registry[str, ModelSpec] = Registry("model_type", lambda s: s.model_type)
        self.samplers: Registry[str, ProcessorSpec] = Registry(
            "logits processor", lambda s: s.name, order=lambda s: s.order
        )
        self.builds: Registry[str, BuildSpec] = Registry("build step", lambda s: s.backend)
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
        taken = self.plugins.get(name)
        if taken is not None and taken.status != "failed":  # the loaded plugin stays as it is
            self._fail(info, PluginError(
                f"a plugin named {name!r} is already loaded ({taken.origin}: {taken.module}); "
                "register this one under another name"))  # fmt: skip
            return info
        self.plugins[name] = info
        self._register(info, plugin)
        return info

    def _fail(self, info: PluginInfo, exc: BaseException) -> None:
        """Mark ``info`` failed: the error's first line (tables stay one line a plugin; the
        whole error and its traceback go to the debug log)."""
        info.status = "failed"
        first = (str(exc).strip().splitlines() or [""])[0]
        info.error = f"{type(exc).__name__}: {first}"
        log.warning("plugin %r skipped: %s", info.name, info.error)
        log.debug("".join(traceback.format_exception(exc)))

    def unavailable_backends(self) -> dict[str, str]:
        """Plugin name -> why it is not usable, for plugins that failed to load or were
        disabled (a first-party plugin's name is its backend's name)."""
        out = {}
        for name, info in self.plugins.items():
            dist = f" ({info.distribution})" if info.distribution else ""
            if info.status == "failed":
                out[name] = f"plugin {name!r}{dist} is installed but failed to load: {info.error}"
            elif info.status == "disabled":
                out[name] = f"plugin {name!r}{dist} is disabled (PACE_DISABLE_PLUGINS)"
        return out

    def resolver(self, config: OperatorConfig, cpu: CpuInfo | None = None) -> OpResolver:
        """An op resolver over this host's kernels that knows why missing plugins are missing."""
        return OpResolver(self.ops, config, cpu, unavailable=self.unavailable_backends())

    def _register(self, info: PluginInfo, plugin: Any) -> None:
        try:
            check_contract_version(info.name, plugin)
            self.pm.register(plugin, name=info.name)
        except Exception as exc:
            self._fail(info, exc)
            return
        try:
            self._check_hooks(info.name)
        except Exception as exc:
            self.pm.unregister(name=info.name)
            self._fail(info, exc)
            return
        self._register_builds(info)
        regs = Registrations(info.name)
        try:
            for hook in HOOKS:
                for impl in self._impls(hook, info.name):
                    impl.function(registry=regs)
            merges = self._merges(regs)
            for registry, specs in merges:  # check everything before storing anything
                registry.check(specs)
        except Exception as exc:
            self.pm.unregister(name=info.name)
            self._fail(info, exc)
            return
        for registry, specs in merges:
            registry.merge(specs)
        info.provides = {
            "kernels": len(regs.kernels),
            "caches": len(regs.caches),
            "models": len(regs.models),
            "processors": len(regs.processors),
        }

    def _merges(self, regs: Registrations) -> list[tuple[Registry, list]]:
        return [
            (self.ops, regs.kernels),
            (self.caches, regs.caches),
            (self.models, regs.models),
            (self.samplers, regs.processors),
        ]

    def _check_hooks(self, plugin: str) -> None:
        """Every hook of ``plugin`` is one of pace's (a misspelt name would register nothing)
        and a plain implementation: pace calls each plugin's hooks itself, with no wrappers."""
        self.pm.check_pending()
        for hook in (*HOOKS, "pace_register_builds"):
            for impl in self._impls(hook, plugin):
                if impl.hookwrapper or impl.wrapper:
                    raise ContractError(
                        f"plugin {plugin!r}: {hook} is a hook wrapper; pace calls each "
                        "plugin's hooks directly: drop hookwrapper=True / wrapper=True"
                    )

    def _impls(self, hook: str, plugin: str) -> list[Any]:
        """This plugin's implementations of ``hook`` (see hookspecs: hooks run per plugin)."""
        return [i for i in getattr(self.pm.hook, hook).get_hookimpls() if i.plugin_name == plugin]

    def _register_builds(self, info: PluginInfo) -> None:
        """Build steps first and on their own: they stay when the other hooks fail."""
        regs = Registrations(info.name)
        try:
            for impl in self._impls("pace_register_builds", info.name):
                impl.function(registry=regs)
            self.builds.merge(regs.builds)
        except Exception as exc:
            log.warning("plugin %r: build step not registered: %s", info.name, exc)


HOOKS = ("pace_register_ops", "pace_register_kv_caches", "pace_register_models",
         "pace_register_samplers")  # fmt: skip


def check_contract_version(name: str, plugin: Any) -> None:
    """A plugin states ``PACE_CONTRACT_VERSION``; it must be the core's ``CONTRACT_VERSION``."""
    stated = getattr(plugin, "PACE_CONTRACT_VERSION", None)
    where = getattr(plugin, "__name__", type(plugin).__name__)
    if stated is None:
        raise ContractError(
            f"plugin {name!r} does not state the contract version it was written for: set "
            f"PACE_CONTRACT_VERSION = {CONTRACT_VERSION} in {where} "
            "(pace_core.CONTRACT_VERSION)"
        )
    if stated != CONTRACT_VERSION:
        raise ContractError(
            f"plugin {name!r} was written for pace contract version {stated!r}, but this "
            f"pace-core implements version {CONTRACT_VERSION}; install a release of the plugin "
            "made for this pace-core (or a pace-core matching the plugin)"
        )


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
