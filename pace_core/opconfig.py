"""OperatorConfig: which backend runs each op, and the resolver that honours it.

Resolution happens once per call site when a model is built. The chain for an op is:
the pinned backend if it can run, else the best available candidate by priority (``auto``),
which always ends at ``native``. Each fallback logs one line with the reason;
``strict=True`` turns a fallback into an :class:`OpResolutionError`.
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pace_core.cpu import CpuInfo, detect_cpu
from pace_core.errors import ConfigError, OpResolutionError
from pace_core.ops import OP_GROUPS, OPS
from pace_core.registry import KernelSpec, OpContext, Registry, backends

log = logging.getLogger("pace.ops")

AUTO = "auto"
# First-party backends: pinning one that is not installed falls back instead of erroring.
KNOWN_BACKENDS = ("native", "avx512", "tpp", "onednn")
ENV_VAR = "PACE_OPCONFIG"
_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


def _suggest(value: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(value, choices, n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclass(frozen=True)
class OperatorConfig:
    """Backend choice per op: ``OperatorConfig(linear="avx512", norm="native", strict=True)``.

    ``default`` applies to every op not named; ``norm`` sets both norm ops.
    """

    backends: Mapping[str, str] = field(default_factory=dict)
    default: str = AUTO
    strict: bool = False

    def __init__(
        self,
        backends: Mapping[str, str] | None = None,
        *,
        default: str = AUTO,
        strict: bool = False,
        **ops: str,
    ) -> None:
        merged: dict[str, str] = {}
        for key, value in {**(backends or {}), **ops}.items():
            if not isinstance(key, str):
                raise ConfigError(f"OperatorConfig keys are op names (got {key!r})")
            if not isinstance(value, str) or not value:
                raise ConfigError(
                    f"backend for op {key!r} must be a non-empty string (got {value!r})"
                )
            for op in self._expand(key):
                merged[op] = value.lower()
        if not isinstance(default, str) or not default:
            raise ConfigError(f"default backend must be a non-empty string (got {default!r})")
        if not isinstance(strict, bool):
            raise ConfigError(f"strict must be True or False (got {strict!r})")
        object.__setattr__(self, "backends", merged)
        object.__setattr__(self, "default", default.lower())
        object.__setattr__(self, "strict", strict)

    def __hash__(self) -> int:
        return hash((tuple(sorted(self.backends.items())), self.default, self.strict))

    @staticmethod
    def _expand(key: str) -> tuple[str, ...]:
        if key in OPS:
            return (key,)
        if key in OP_GROUPS:
            return OP_GROUPS[key]
        names = [*OPS, *OP_GROUPS]
        raise ConfigError(
            f"unknown op {key!r} in OperatorConfig{_suggest(key, names)}; "
            f"valid ops: {', '.join(names)}"
        )

    # -- construction from text -----------------------------------------------------------
    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> OperatorConfig:
        """From ``{"linear": "avx512", "strict": true, "default": "auto"}``."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"OperatorConfig expects a mapping (got {type(data).__name__})")
        data = dict(data)
        strict = data.pop("strict", False)
        if not isinstance(strict, bool):
            raise ConfigError(f"'strict' must be true or false (got {strict!r})")
        default = data.pop("default", AUTO)
        return cls(data, default=default, strict=strict)

    @classmethod
    def parse(cls, text: str) -> OperatorConfig:
        """From JSON (``'{"linear": "avx512"}'``) or ``'linear=avx512,norm=native,strict=1'``."""
        text = text.strip()
        if not text:
            return cls()
        if text.startswith("{"):
            try:
                return cls.from_dict(json.loads(text))
            except json.JSONDecodeError as exc:
                raise ConfigError(f"OperatorConfig JSON is malformed: {exc} in {text!r}") from None
        data: dict[str, Any] = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise ConfigError(
                    f"bad OperatorConfig item {item!r} in {text!r}; write op=backend pairs "
                    "separated by commas, e.g. 'linear=avx512,norm=native'"
                )
            key, value = key.strip(), value.strip()
            if key == "strict":
                if value.lower() not in _TRUE + _FALSE:
                    raise ConfigError(
                        f"bad OperatorConfig item {item!r} in {text!r}; strict takes "
                        f"{'/'.join(_TRUE)} or {'/'.join(_FALSE)}"
                    )
                data[key] = value.lower() in _TRUE
            else:
                data[key] = value
        return cls.from_dict(data)

    @classmethod
    def from_env(cls) -> OperatorConfig:
        """From ``$PACE_OPCONFIG`` (empty or unset: all ``auto``)."""
        return cls.parse(os.environ.get(ENV_VAR, ""))

    @classmethod
    def coerce(cls, value: OperatorConfig | Mapping[str, Any] | str | None) -> OperatorConfig:
        """Accept an OperatorConfig, a dict, a string, or None (read the environment)."""
        if value is None:
            return cls.from_env()
        if isinstance(value, OperatorConfig):
            return value
        if isinstance(value, str):
            return cls.parse(value)
        return cls.from_dict(value)

    def backend_for(self, op: str) -> str:
        return self.backends.get(op, self.default)

    def to_dict(self) -> dict[str, Any]:
        return {**self.backends, "default": self.default, "strict": self.strict}


@dataclass(frozen=True)
class Resolution:
    """The outcome for one op call site: the kernel chosen and why."""

    op: str
    requested: str
    kernel: KernelSpec
    fallback_reason: str = ""
    rejected: tuple[tuple[str, str], ...] = ()  # (backend, reason) of skipped candidates
    passed_over: tuple[tuple[str, str], ...] = ()  # under auto: the better-ranked ones skipped

    @property
    def note(self) -> str:
        """Why this is not the backend asked for (or, under auto, the best-ranked one)."""
        if self.fallback_reason:
            return self.fallback_reason
        return "; ".join(f"{backend}: {reason}" for backend, reason in self.passed_over)

    @property
    def backend(self) -> str:
        return self.kernel.backend


class OpResolver:
    """Resolves ``(op, context)`` to kernels under one OperatorConfig; caches per context."""

    def __init__(
        self,
        registry: Registry[tuple[str, str], KernelSpec],
        config: OperatorConfig,
        cpu: CpuInfo | None = None,
        *,
        unavailable: Mapping[str, str] | None = None,
    ) -> None:
        """``unavailable``: plugin name (a first-party plugin's is its backend's) -> why it did
        not load (stated when a pinned backend falls back, or a backend name is unknown)."""
        self.registry = registry
        self.unavailable = dict(unavailable or {})
        self.config = config
        self.cpu = cpu or detect_cpu()
        self.resolutions: dict[tuple[str, str], Resolution] = {}
        self._logged: set[tuple[str, str, str]] = set()
        self.broken: dict[tuple[str, str], str] = {}  # (op, backend) -> why it failed at load
        self._validate_backend_names()

    def _validate_backend_names(self) -> None:
        registered = set(backends(self.registry))
        valid = sorted(registered | set(KNOWN_BACKENDS) | {AUTO})
        for op in OPS:
            name = self.config.backend_for(op)
            if name not in valid:
                if name in self.unavailable:
                    why = f" ({self.unavailable[name]})"
                elif self.unavailable:  # a plugin's name need not be its backend's
                    why = "; not loaded, so their backends are unknown: " + "; ".join(
                        self.unavailable.values()
                    )
                else:
                    why = ""
                where = f"op {op!r}" if op in self.config.backends else "default"
                raise ConfigError(
                    f"unknown backend {name!r} for {where}{_suggest(name, valid)}; "
                    f"valid choices: {', '.join(valid)}{why}"
                )

    def resolve(self, ctx: OpContext) -> Resolution:
        """Pick the kernel for ``ctx`` (memoised by op and context)."""
        key = (ctx.op, repr((ctx.dtype, sorted(ctx.attrs.items()))))
        found = self.resolutions.get(key)
        if found is None:
            found = self.resolutions[key] = self._resolve(ctx)
        return found

    def disable(self, spec: KernelSpec, reason: str) -> None:
        """Stop choosing ``spec`` (e.g. its prepare step failed to build); re-resolve its op."""
        self.broken[(spec.op, spec.backend)] = reason
        self.resolutions = {k: r for k, r in self.resolutions.items() if k[0] != spec.op}
        log.warning("op %s: backend %r disabled: %s", spec.op, spec.backend, reason)

    def _resolve(self, ctx: OpContext) -> Resolution:
        requested = self.config.backend_for(ctx.op)
        candidates = self.registry.where(op=ctx.op)
        rejected: list[tuple[str, str]] = []
        usable: list[KernelSpec] = []
        for spec in candidates:
            reason = self.broken.get((spec.op, spec.backend)) or spec.check(ctx, self.cpu.features)
            if reason is None:
                usable.append(spec)
            else:
                rejected.append((spec.backend, reason))
        if not usable:
            detail = "; ".join(f"{b}: {r}" for b, r in rejected) or "no kernel registered"
            if candidates and all(s.layout_problem(ctx) for s in candidates):
                raise ConfigError(
                    f"no kernel for op {ctx.op!r} reads this KV cache ({detail}): choose "
                    "another kv_cache_type / kv_cache_dtype"
                )
            raise OpResolutionError(
                f"no usable kernel for op {ctx.op!r} ({detail}). Is the pace-native plugin "
                "installed and not disabled (PACE_DISABLE_PLUGINS)?"
            )
        if requested == AUTO:
            ranks = {s.backend: s.priority for s in candidates}
            passed = tuple((b, r) for b, r in rejected if ranks[b] > usable[0].priority)
            return Resolution(ctx.op, requested, usable[0], rejected=tuple(rejected),
                              passed_over=passed)  # fmt: skip
        pinned = next((s for s in usable if s.backend == requested), None)
        if pinned is not None:
            return Resolution(ctx.op, requested, pinned, rejected=tuple(rejected))
        incompatible = next(
            (s for s in candidates if s.backend == requested and s.layout_problem(ctx)), None
        )
        if incompatible is not None:
            compatible = [s.backend for s in candidates if not s.layout_problem(ctx)]
            raise ConfigError(
                f"op {ctx.op!r}: backend {requested!r} cannot be used with this KV cache "
                f"({incompatible.layout_problem(ctx)}); compatible backends: "
                f"{', '.join(compatible) or 'none'} — or choose another kv_cache_type / "
                "kv_cache_dtype"
            )
        reason = dict(rejected).get(requested)
        if reason is None:
            if requested in self.unavailable:
                reason = self.unavailable[requested]
            elif requested in KNOWN_BACKENDS and requested not in backends(self.registry):
                reason = f"plugin pace-{requested} is not installed"
            else:
                reason = f"no installed plugin provides backend {requested!r} for this op"
        if self.config.strict:
            raise OpResolutionError(
                f"op {ctx.op!r}: pinned backend {requested!r} unavailable ({reason}); "
                f"available: {', '.join(s.backend for s in usable)}. Pin one of those or drop "
                "strict=True to allow fallback."
            )
        chosen = usable[0]
        log_key = (ctx.op, requested, reason)
        if log_key not in self._logged:
            self._logged.add(log_key)
            log.warning(
                "op %s: backend %r unavailable (%s); falling back to %r",
                ctx.op,
                requested,
                reason,
                chosen.backend,
            )
        return Resolution(ctx.op, requested, chosen, reason, tuple(rejected))
