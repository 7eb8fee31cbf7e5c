"""The plugin contract: hook specifications of the ``pace`` project.

Every hook receives a registry object and adds to it (the tox pattern): a plugin declares
what it provides and never patches the core. The core's own models, caches and sampling
processors are registered through these same hooks by built-in plugins.

The host calls each plugin's hooks on their own, one plugin at a time, each into a fresh
:class:`~pace_core.registry.Registrations` that it then validates and merges all or nothing
(a plugin that fails half-way leaves no trace). So pluggy's ordering markers do nothing here:
``tryfirst``/``trylast``/``hookwrapper`` on these hooks have no effect, and no plugin sees or
changes another's registrations. Which kernel wins is stated as data instead: ``priority``
of :meth:`~pace_core.registry.Registrations.add_kernel` under ``auto``, and the user's
OperatorConfig. A plugin module also states ``PACE_CONTRACT_VERSION`` (see
:data:`pace_core.ops.CONTRACT_VERSION`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pluggy

PROJECT_NAME = "pace"

hookspec = pluggy.HookspecMarker(PROJECT_NAME)
hookimpl = pluggy.HookimplMarker(PROJECT_NAME)

if TYPE_CHECKING:
    from pace_core.registry import Registrations


@hookspec
def pace_register_ops(registry: Registrations) -> None:
    """Register kernels: ``registry.add_kernel(op=..., backend=..., fn=..., ...)``."""


@hookspec
def pace_register_kv_caches(registry: Registrations) -> None:
    """Register KV cache types: ``registry.add_cache(name, factory, layout=...)``."""


@hookspec
def pace_register_models(registry: Registrations) -> None:
    """Register model architectures: ``registry.add_model(model_type, builder, ...)``."""


@hookspec
def pace_register_samplers(registry: Registrations) -> None:
    """Register logits processors: ``registry.add_processor(name, factory, order=...)``."""


@hookspec
def pace_register_builds(registry: Registrations) -> None:
    """Offer an ahead-of-time build of JIT-compiled kernels:
    ``registry.add_build(backend, fn)``;
    ``fn()`` builds or finds the cached build and returns
    where it is, raises :class:`~pace_core.registry.BuildNotApplicable` when this machine needs
    none, and raises anything else on failure. ``pace build-kernels`` runs them. This hook runs
    even if the plugin's other hooks fail, so a failed build can be retried."""
