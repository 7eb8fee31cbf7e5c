"""Registries handed to plugin hooks. Plugins add to them; the core reads them.

Each registry keeps the registrations of the plugin currently being loaded apart until its
hook returns, so a plugin that fails half-way leaves nothing behind.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from pace_core.errors import PluginError
from pace_core.ops import OPS

SupportPredicate = Callable[["OpContext"], "bool | str"]


@dataclass(frozen=True)
class OpContext:
    """What a kernel's support predicate may look at: the dtype and op-specific facts."""

    op: str
    dtype: torch.dtype
    attrs: dict[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "attrs":
            raise AttributeError(name)
        try:
            return self.attrs[name]
        except KeyError:
            raise AttributeError(name) from None

    def __hash__(self) -> int:
        return hash((self.op, self.dtype, tuple(sorted(self.attrs.items()))))


@dataclass(frozen=True)
class KernelSpec:
    """One kernel: an implementation of ``op`` by ``backend``, and when it can run."""

    op: str
    backend: str
    fn: Callable[..., Any]
    dtypes: frozenset[torch.dtype]
    cpu_features: frozenset[str] = frozenset()
    supports: SupportPredicate | None = None
    prepare: Callable[..., Any] | None = None
    priority: int = 0
    plugin: str = ""
    description: str = ""
    cache_layouts: frozenset[str] | None = None  # attention: the KV layouts it reads

    def layout_problem(self, ctx: OpContext) -> str | None:
        """The reason this kernel cannot read the context's KV cache layout, if any."""
        layout = ctx.attrs.get("cache_layout")
        if self.cache_layouts is None or layout is None or layout in self.cache_layouts:
            return None
        return f"reads cache layouts {', '.join(sorted(self.cache_layouts))}, not {layout!r}"

    def check(self, ctx: OpContext, cpu_features: frozenset[str]) -> str | None:
        """Return None when this kernel can run for ``ctx`` on this CPU, else the reason."""
        missing = self.cpu_features - cpu_features
        if missing:
            return f"missing CPU features: {', '.join(sorted(missing))}"
        layout = self.layout_problem(ctx)
        if layout:
            return layout
        if ctx.dtype not in self.dtypes:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
            return f"dtype {str(ctx.dtype).removeprefix('torch.')} unsupported (supports {names})"
        if self.supports is not None:
            verdict = self.supports(ctx)
            if verdict is not True:
                return verdict if isinstance(verdict, str) and verdict else "unsupported shape"
        return None


class _StagedRegistry:
    """Shared staging logic: registrations are kept per plugin until committed."""

    def __init__(self) -> None:
        self._plugin = ""
        self._staged: list[Any] = []

    def _begin(self, plugin: str) -> None:
        self._plugin, self._staged = plugin, []

    def _rollback(self) -> None:
        self._staged = []

    def _validate(self) -> None:
        """Raise if any staged item clashes with a stored one or another staged one."""
        seen: dict[Any, Any] = {}
        for item in self._staged:
            key = self._key(item)
            self._check(item, seen.get(key))
            seen[key] = item

    def _commit(self) -> None:
        """Store every staged item, or none of them: all are checked before any is stored."""
        self._validate()
        for item in self._staged:
            self._put(item)
        self._staged = []

    def _key(self, item: Any) -> Any:
        raise NotImplementedError

    def _check(self, item: Any, staged_twin: Any | None) -> None:
        """Raise PluginError if ``item`` is already stored or staged (``staged_twin``)."""
        raise NotImplementedError

    def _put(self, item: Any) -> None:
        raise NotImplementedError


class OpRegistry(_StagedRegistry):
    """Kernels by op and backend."""

    def __init__(self) -> None:
        super().__init__()
        self._kernels: dict[str, dict[str, KernelSpec]] = {op: {} for op in OPS}

    def add_kernel(
        self,
        op: str,
        backend: str,
        fn: Callable[..., Any],
        *,
        dtypes: Iterable[torch.dtype] = (torch.float32, torch.bfloat16),
        cpu_features: Iterable[str] = (),
        supports: SupportPredicate | None = None,
        prepare: Callable[..., Any] | None = None,
        priority: int = 0,
        description: str = "",
        cache_layouts: Iterable[str] | None = None,
    ) -> KernelSpec:
        """Declare a kernel. ``priority`` orders candidates under ``auto`` (higher first)."""
        if op not in OPS:
            raise PluginError(f"unknown op {op!r}; the op catalogue has: {', '.join(OPS)}")
        if not backend or not backend.replace("_", "").isalnum():
            raise PluginError(f"backend name must be alphanumeric/underscore (got {backend!r})")
        if OPS[op].prepared and prepare is None:
            raise PluginError(f"op {op!r} needs a prepare step (backend {backend!r} gave none)")
        spec = KernelSpec(
            op=op,
            backend=backend,
            fn=fn,
            dtypes=frozenset(dtypes),
            cpu_features=frozenset(cpu_features),
            supports=supports,
            prepare=prepare,
            priority=priority,
            plugin=self._plugin,
            description=description,
            cache_layouts=None if cache_layouts is None else frozenset(cache_layouts),
        )
        self._staged.append(spec)
        return spec

    def _key(self, spec: KernelSpec) -> tuple[str, str]:
        return (spec.op, spec.backend)

    def _check(self, spec: KernelSpec, staged_twin: KernelSpec | None) -> None:
        existing = self._kernels[spec.op].get(spec.backend) or staged_twin
        if existing is not None:
            raise PluginError(
                f"backend {spec.backend!r} for op {spec.op!r} is registered twice "
                f"(plugins {existing.plugin!r} and {spec.plugin!r})"
            )

    def _put(self, spec: KernelSpec) -> None:
        self._kernels[spec.op][spec.backend] = spec

    def candidates(self, op: str) -> list[KernelSpec]:
        """Kernels for ``op``, best priority first."""
        return sorted(self._kernels[op].values(), key=lambda s: -s.priority)

    def backends(self, op: str | None = None) -> list[str]:
        """Backend names registered for ``op`` (or for any op)."""
        ops = [op] if op else list(self._kernels)
        return sorted({b for o in ops for b in self._kernels[o]})

    def count(self, plugin: str) -> int:
        return sum(s.plugin == plugin for by in self._kernels.values() for s in by.values())


@dataclass(frozen=True)
class CacheSpec:
    """A KV cache type: its name, factory and the memory layout attention kernels read."""

    name: str
    factory: Callable[..., Any]
    layout: str
    plugin: str = ""
    description: str = ""


class CacheRegistry(_StagedRegistry):
    """KV cache types by name."""

    def __init__(self) -> None:
        super().__init__()
        self.caches: dict[str, CacheSpec] = {}

    def add_cache(
        self, name: str, factory: Callable[..., Any], *, layout: str, description: str = ""
    ) -> None:
        self._staged.append(CacheSpec(name, factory, layout, self._plugin, description))

    def _key(self, spec: CacheSpec) -> str:
        return spec.name

    def _check(self, spec: CacheSpec, staged_twin: CacheSpec | None) -> None:
        if spec.name in self.caches or staged_twin is not None:
            raise PluginError(f"KV cache {spec.name!r} is registered twice")

    def _put(self, spec: CacheSpec) -> None:
        self.caches[spec.name] = spec

    def count(self, plugin: str) -> int:
        return sum(s.plugin == plugin for s in self.caches.values())


@dataclass(frozen=True)
class ModelSpec:
    """A model architecture: the HF ``model_type`` values it serves and its builder."""

    model_type: str
    builder: Callable[..., Any]
    plugin: str = ""
    description: str = ""


class ModelRegistry(_StagedRegistry):
    """Model builders by HF ``model_type``."""

    def __init__(self) -> None:
        super().__init__()
        self.models: dict[str, ModelSpec] = {}

    def add_model(
        self, model_type: str, builder: Callable[..., Any], description: str = ""
    ) -> None:
        self._staged.append(ModelSpec(model_type, builder, self._plugin, description))

    def _key(self, spec: ModelSpec) -> str:
        return spec.model_type

    def _check(self, spec: ModelSpec, staged_twin: ModelSpec | None) -> None:
        existing = self.models.get(spec.model_type) or staged_twin
        if existing is not None:
            raise PluginError(
                f"model_type {spec.model_type!r} registered twice "
                f"(plugins {existing.plugin!r} and {spec.plugin!r})"
            )

    def _put(self, spec: ModelSpec) -> None:
        self.models[spec.model_type] = spec

    def count(self, plugin: str) -> int:
        return sum(s.plugin == plugin for s in self.models.values())


@dataclass(frozen=True)
class ProcessorSpec:
    """A batched logits processor: ``factory(configs) -> processor | None``, applied by order."""

    name: str
    factory: Callable[..., Any]
    order: int
    plugin: str = ""


class SamplerRegistry(_StagedRegistry):
    """Logits processors, applied in ascending ``order``."""

    def __init__(self) -> None:
        super().__init__()
        self.processors: dict[str, ProcessorSpec] = {}

    def add_processor(self, name: str, factory: Callable[..., Any], *, order: int) -> None:
        self._staged.append(ProcessorSpec(name, factory, order, self._plugin))

    def _key(self, spec: ProcessorSpec) -> str:
        return spec.name

    def _check(self, spec: ProcessorSpec, staged_twin: ProcessorSpec | None) -> None:
        if spec.name in self.processors or staged_twin is not None:
            raise PluginError(f"logits processor {spec.name!r} registered twice")

    def _put(self, spec: ProcessorSpec) -> None:
        self.processors[spec.name] = spec

    def ordered(self) -> list[ProcessorSpec]:
        return sorted(self.processors.values(), key=lambda s: s.order)

    def count(self, plugin: str) -> int:
        return sum(s.plugin == plugin for s in self.processors.values())


@dataclass(frozen=True)
class BuildSpec:
    """An ahead-of-time build step of a backend's JIT kernels (``pace build-kernels``)."""

    backend: str
    fn: Callable[[], str]  # builds (or finds the cached build); returns where it lives
    plugin: str = ""
    description: str = ""


class BuildNotApplicable(PluginError):
    """Raised by a build step when nothing needs building here (e.g. the CPU lacks the ISA)."""


class BuildRegistry(_StagedRegistry):
    """Build steps by backend. Kept even when the plugin's other hooks fail: re-running the
    build is how a failed JIT build is retried."""

    def __init__(self) -> None:
        super().__init__()
        self.builds: dict[str, BuildSpec] = {}

    def add_build(self, backend: str, fn: Callable[[], str], *, description: str = "") -> None:
        self._staged.append(BuildSpec(backend, fn, self._plugin, description))

    def _key(self, spec: BuildSpec) -> str:
        return spec.backend

    def _check(self, spec: BuildSpec, staged_twin: BuildSpec | None) -> None:
        if spec.backend in self.builds or staged_twin is not None:
            raise PluginError(f"a build step for backend {spec.backend!r} is registered twice")

    def _put(self, spec: BuildSpec) -> None:
        self.builds[spec.backend] = spec

    def count(self, plugin: str) -> int:
        return sum(s.plugin == plugin for s in self.builds.values())
