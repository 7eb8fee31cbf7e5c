"""pace-example: a minimal third-party pace plugin (see docs/plugins.md)."""
