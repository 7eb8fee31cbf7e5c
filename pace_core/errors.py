"""Exceptions raised by pace; each message names the bad value and the fix."""


class PaceError(Exception):
    """Base class of pace's own errors."""


class ConfigError(PaceError, ValueError):
    """A user-supplied configuration value is invalid."""


class OpResolutionError(PaceError):
    """No usable kernel for an op (or a pinned backend is unavailable under ``strict``)."""


class PluginError(PaceError):
    """A plugin registered something invalid."""


class ModelLoadError(PaceError, ValueError):
    """A checkpoint cannot be loaded (missing/unexpected tensors, corrupt file, bad config)."""


class ContractError(PluginError):
    """Code broke the op contract (an undeclared context attribute, a wrong kernel arity, a
    plugin written for another contract version). Not an AttributeError on purpose: a
    ``getattr(ctx, name, None)`` with a misspelt name raises instead of returning None."""
