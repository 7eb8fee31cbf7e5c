"""pace-broken: a test fixture whose entry point module fails on import."""
