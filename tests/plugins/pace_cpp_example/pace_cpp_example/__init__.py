"""pace-cpp-example: a minimal third-party pace plugin with a C++ kernel (see docs/plugins.md)."""
