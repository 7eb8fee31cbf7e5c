"""What plugins register, and the one registry type the host keeps it in.

A plugin's hooks add to a fresh :class:`Registrations` (the tox pattern: a registry passed
into the hook). The host then validates everything the plugin registered against what is
already stored and merges it, all or nothing (see ``plugins.PluginHost``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import torch

from pace_core.caches.base import CACHE_PROTOCOLS, missing_members
from pace_core.caches.kv_quant import AUTO, KV_DTYPES
from pace_core.cpu import KNOWN_FEATURES
from pace_core.errors import ContractError, PluginError
from pace_core.ops import OPS
from pace_core.quant.weight import DENSE, WEIGHT_FORMATS

SupportPredicate = Callable[["OpContext"], "bool | str"]
BACKEND_NAME = re.compile(r"[a-z][a-z0-9_]*")  # as OperatorConfig reads them: lower case
RESERVED_BACKENDS = ("auto", "default")  # OperatorConfig's own words


@dataclass(frozen=True)
class OpContext:
    """What a kernel's support predicate may look at: ``op``, ``dtype`` and the op's declared
    context attributes (``OpSpec.context``), read as attributes. A declared attribute the call
    site did not set reads as None; an undeclared one raises :class:`ContractError`."""

    op: str
    dtype: torch.dtype
    attrs: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        spec = OPS.get(self.op)
        if spec is None:
            raise ContractError(f"unknown op {self.op!r}; the op catalogue has: {', '.join(OPS)}")
        extra = sorted(set(self.attrs) - set(spec.context))
        if extra:
            raise ContractError(
                f"op {self.op!r} declares no context attribute(s) {extra}; "
                f"declared: {', '.join(spec.context) or 'none'}"
            )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name == "attrs":
            raise AttributeError(name)
        declared = OPS[self.op].context
        if name not in declared:
            raise ContractError(
                f"op {self.op!r} has no context attribute {name!r}; a supports predicate may "
                f"read op, dtype and: {', '.join(declared) or 'nothing else'}"
            )
        return self.attrs.get(name)

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
    # ops reading the KV cache (context ``kv_dtype``): the storage dtypes it reads
    kv_dtypes: frozenset[str] = frozenset({AUTO})
    weight_formats: frozenset[str] = frozenset({DENSE})  # formats of the weights it takes
    # decoder_stack: computes only the real tokens of a ragged step (rows adding different
    # token counts), so prefill chunks and decodes can share one forward without padding
    packs_ragged: bool = False

    def format_problem(self, ctx: OpContext) -> str | None:
        """The reason this kernel cannot take the context's weight format(s), if any."""
        fmt = ctx.attrs.get("weight_format")
        if fmt is None:
            return None
        missing = sorted(set(fmt.split("+")) - self.weight_formats)
        if not missing:
            return None
        return (
            f"weight format {'+'.join(missing)} unsupported "
            f"(takes {', '.join(sorted(self.weight_formats))})"
        )

    def layout_problem(self, ctx: OpContext) -> str | None:
        """The reason this kernel cannot read the context's KV cache (its layout or storage
        dtype, ``kv_cache_dtype``), if any."""
        kv = ctx.attrs.get("kv_dtype")
        if kv is not None and kv not in self.kv_dtypes:
            return f"reads KV cache dtypes {', '.join(sorted(self.kv_dtypes))}, not {kv!r}"
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
        fmt = self.format_problem(ctx)
        if fmt:
            return fmt
        if ctx.dtype not in self.dtypes:
            names = ", ".join(sorted(str(d).removeprefix("torch.") for d in self.dtypes))
            return f"dtype {str(ctx.dtype).removeprefix('torch.')} unsupported (supports {names})"
        if self.supports is not None:
            try:
                verdict = self.supports(ctx)
            except Exception as exc:  # a plugin's bug: this kernel is out, the others stay
                return (
                    f"its supports predicate raised {type(exc).__name__}: {exc} (a bug in "
                    f"plugin {self.plugin!r})"
                )
            if verdict is not True:
                return verdict if isinstance(verdict, str) and verdict else "unsupported shape"
        return None


@dataclass(frozen=True)
class CacheSpec:
    """A KV cache type: its name, factory and the memory layout attention kernels read."""

    name: str
    factory: Callable[..., Any]
    layout: str
    plugin: str = ""
    description: str = ""
    value_dims: bool = False  # honours the ``value_dims`` option (per-layer value widths)
    kv_dtypes: frozenset[str] = frozenset({AUTO})  # ``kv_dtype`` options it honours


@dataclass(frozen=True)
class ModelSpec:
    """A model architecture: the HF ``model_type`` it serves and its builder."""

    model_type: str
    builder: Callable[..., Any]
    plugin: str = ""
    description: str = ""


@dataclass(frozen=True)
class ProcessorSpec:
    """A batched logits processor: ``factory(configs) -> processor | None``, applied by order."""

    name: str
    factory: Callable[..., Any]
    order: int
    plugin: str = ""


@dataclass(frozen=True)
class BuildSpec:
    """An ahead-of-time build step of a backend's JIT kernels (``pace build-kernels``)."""

    backend: str
    fn: Callable[[], str]  # builds (or finds the cached build); returns where it lives
    plugin: str = ""
    description: str = ""


class BuildNotApplicable(PluginError):
    """Raised by a build step when nothing needs building here (e.g. the CPU lacks the ISA)."""


K = TypeVar("K")
S = TypeVar("S")


class Registry(Generic[K, S]):
    """Specs by key, in ``order``; a key registered twice is a :class:`PluginError`.

    ``what`` names the kind of spec in that error (``"KV cache"``), ``key`` gives a spec's
    key, and ``order`` (optional) the sort key of :meth:`values`.
    """

    def __init__(
        self,
        what: str,
        key: Callable[[S], K],
        order: Callable[[S], Any] | None = None,
    ) -> None:
        self.what, self._key, self._order = what, key, order
        self._items: dict[K, S] = {}

    def check(self, specs: Iterable[S]) -> None:
        """Raise if any of ``specs`` clashes with a stored spec or with another of them."""
        seen: dict[K, S] = {}
        for spec in specs:
            key = self._key(spec)
            twin = self._items.get(key) or seen.get(key)
            if twin is not None:
                plugins = (getattr(twin, "plugin", ""), getattr(spec, "plugin", ""))
                raise PluginError(
                    f"{self.what} {_show(key)} is registered twice "
                    f"(plugins {plugins[0]!r} and {plugins[1]!r})"
                )
            seen[key] = spec

    def merge(self, specs: Iterable[S]) -> None:
        """Store all of ``specs`` or, when one clashes, none of them."""
        specs = list(specs)
        self.check(specs)
        for spec in specs:
            self._items[self._key(spec)] = spec

    def values(self) -> list[S]:
        items = list(self._items.values())
        return sorted(items, key=self._order) if self._order else items

    def where(self, **fields: Any) -> list[S]:
        """The specs (in order) whose attributes equal ``fields``."""
        return [s for s in self.values() if all(getattr(s, k) == v for k, v in fields.items())]

    def get(self, key: K, default: S | None = None) -> S | None:
        """The spec of ``key``, or ``default`` (also for a key no spec can have: a list)."""
        try:
            return self._items.get(key, default)
        except TypeError:  # unhashable
            return default

    def __getitem__(self, key: K) -> S:
        return self._items[key]

    def __contains__(self, key: object) -> bool:
        try:
            return key in self._items
        except TypeError:  # unhashable: a user's list where a name belongs
            return False

    def __iter__(self) -> Iterator[K]:
        return iter(sorted(self._items, key=str))

    def __len__(self) -> int:
        return len(self._items)


def _check_kv_dtypes(kv_dtypes: Iterable[str], what: str) -> None:
    unknown = sorted(set(kv_dtypes) - set(KV_DTYPES))
    if unknown:
        raise PluginError(
            f"{what} declares unknown KV cache dtype(s) {unknown}; known: {', '.join(KV_DTYPES)}"
        )


def _show(key: Any) -> str:
    if isinstance(key, tuple) and len(key) == 2:  # kernels: (op, backend)
        return f"{key[1]!r} for op {key[0]!r}"
    return repr(key)


def kernel_registry() -> Registry[tuple[str, str], KernelSpec]:
    """Kernels by ``(op, backend)``, best priority first."""
    return Registry("backend", lambda s: (s.op, s.backend), order=lambda s: -s.priority)


def backends(kernels: Registry[tuple[str, str], KernelSpec], op: str | None = None) -> list[str]:
    """Backend names registered for ``op`` (or for any op), sorted."""
    return sorted({b for o, b in kernels if op is None or o == op})


class Registrations:
    """What one plugin registers; handed to each of its hooks as ``registry``.

    Nothing here is visible to the engine until the host has validated and merged it.
    """

    def __init__(self, plugin: str) -> None:
        self.plugin = plugin
        self.kernels: list[KernelSpec] = []
        self.caches: list[CacheSpec] = []
        self.models: list[ModelSpec] = []
        self.processors: list[ProcessorSpec] = []
        self.builds: list[BuildSpec] = []

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
        weight_formats: Iterable[str] = (DENSE,),
        packs_ragged: bool = False,
        kv_dtypes: Iterable[str] = (AUTO,),
    ) -> KernelSpec:
        """Declare a kernel. ``priority`` orders candidates under ``auto`` (higher first);
        ``weight_formats``: the formats (``pace_core.quant.WEIGHT_FORMATS``) its prepare step
        accepts, plain float tensors (``"dense"``) by default; ``packs_ragged``
        (``decoder_stack`` only): it computes only the real tokens of a ragged step;
        ``kv_dtypes`` (ops that read the KV cache): the cache storage dtypes
        (``pace_core.caches.kv_quant.KV_DTYPES``) it reads, the model dtype only by default."""
        if packs_ragged and op != "decoder_stack":
            raise PluginError(f"packs_ragged applies to decoder_stack kernels only, not to {op!r}")
        if op not in OPS:
            raise PluginError(f"unknown op {op!r}; the op catalogue has: {', '.join(OPS)}")
        if not isinstance(backend, str) or not BACKEND_NAME.fullmatch(backend):
            raise PluginError(
                f"backend name must be lower case letters, digits and underscores, starting "
                f"with a letter (got {backend!r})"
            )
        if backend in RESERVED_BACKENDS:
            raise PluginError(f"backend name {backend!r} is reserved by OperatorConfig")
        what = f"backend {backend!r} for op {op!r}"
        _need_callable(fn, f"{what}: fn")
        _need_callable(supports, f"{what}: supports", optional=True)
        _need_int(priority, f"{what}: priority")
        dtypes = _need_set(dtypes, f"{what}: dtypes", torch.dtype)
        cpu_features = _need_set(cpu_features, f"{what}: cpu_features", str, KNOWN_FEATURES)
        if cache_layouts is not None:
            cache_layouts = _need_set(cache_layouts, f"{what}: cache_layouts", str)
        if OPS[op].prepared and prepare is None:
            raise PluginError(f"op {op!r} needs a prepare step (backend {backend!r} gave none)")
        problem = OPS[op].call_problem(fn, prepare if OPS[op].prepared else None)
        if problem:
            raise ContractError(f"backend {backend!r} for op {op!r}: {problem}")
        unknown = sorted(set(weight_formats) - set(WEIGHT_FORMATS))
        if unknown:
            raise PluginError(
                f"backend {backend!r} for op {op!r} declares unknown weight format(s) {unknown}; "
                f"known: {', '.join(WEIGHT_FORMATS)}"
            )
        _check_kv_dtypes(kv_dtypes, f"backend {backend!r} for op {op!r}")
        spec = KernelSpec(
            op=op,
            backend=backend,
            fn=fn,
            dtypes=dtypes,
            cpu_features=cpu_features,
            supports=supports,
            prepare=prepare,
            priority=priority,
            plugin=self.plugin,
            description=description,
            cache_layouts=None if cache_layouts is None else frozenset(cache_layouts),
            weight_formats=frozenset(weight_formats),
            packs_ragged=packs_ragged,
            kv_dtypes=frozenset(kv_dtypes),
        )
        self.kernels.append(spec)
        return spec

    def add_cache(
        self,
        name: str,
        factory: Callable[..., Any],
        *,
        layout: str,
        description: str = "",
        value_dims: bool = False,
        kv_dtypes: Iterable[str] = (AUTO,),
    ) -> None:
        """``value_dims``: the factory honours ``value_dims=[...]`` (value rows narrower than
        the keys, 0 for the latent rows of MLA models); models that need it refuse others.
        ``kv_dtypes``: the ``kv_dtype=`` storage dtypes the factory honours
        (``pace_core.caches.kv_quant.KV_DTYPES``; it is passed only when not ``auto``).

        A factory that is a class and declares a built-in ``layout`` must implement that
        layout's protocol (:data:`~pace_core.caches.base.CACHE_PROTOCOLS`: the block caches
        :class:`~pace_core.caches.base.BlockKVCache`, the contiguous ones
        :class:`~pace_core.caches.base.ReservingKVCache`), or this raises ``ContractError``."""
        _need_callable(factory, f"cache {name!r}: factory")
        protocol = CACHE_PROTOCOLS.get(layout)
        if protocol is not None and isinstance(factory, type):
            missing = missing_members(factory, protocol)
            if missing:
                raise ContractError(
                    f"cache {name!r} declares layout {layout!r} but {factory.__name__} lacks "
                    f"{', '.join(missing)} of {protocol.__name__}"
                )
        _check_kv_dtypes(kv_dtypes, f"cache {name!r}")
        self.caches.append(
            CacheSpec(
                name, factory, layout, self.plugin, description, value_dims, frozenset(kv_dtypes)
            )
        )

    def add_model(
        self, model_type: str, builder: Callable[..., Any], description: str = ""
    ) -> None:
        _need_callable(builder, f"model {model_type!r}: builder")
        self.models.append(ModelSpec(model_type, builder, self.plugin, description))

    def add_processor(self, name: str, factory: Callable[..., Any], *, order: int) -> None:
        _need_callable(factory, f"processor {name!r}: factory")
        _need_int(order, f"processor {name!r}: order")
        self.processors.append(ProcessorSpec(name, factory, order, self.plugin))

    def add_build(self, backend: str, fn: Callable[[], str], *, description: str = "") -> None:
        _need_callable(fn, f"build of {backend!r}: fn")
        self.builds.append(BuildSpec(backend, fn, self.plugin, description))


def _need_callable(value: Any, what: str, *, optional: bool = False) -> None:
    if not (callable(value) or (optional and value is None)):
        kind = "a callable or None" if optional else "a callable"
        raise ContractError(f"{what} must be {kind}, not {value!r}")


def _need_int(value: Any, what: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ContractError(f"{what} must be an int, not {value!r}")


def _need_set(
    values: Any, what: str, kind: type, known: Sequence[str] | None = None
) -> frozenset[Any]:
    """``values`` as a frozenset of ``kind`` items (of ``known`` ones, when given)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Iterable):
        raise ContractError(f"{what} must be a collection of {kind.__name__}, not {values!r}")
    items = frozenset(values)
    wrong = [v for v in items if not isinstance(v, kind)]
    if wrong:
        raise ContractError(f"{what} must hold {kind.__name__} items, not {wrong[0]!r}")
    unknown = sorted(items - set(known)) if known is not None else []
    if unknown:
        raise ContractError(f"{what}: unknown {unknown}; known: {', '.join(known)}")
    return items
