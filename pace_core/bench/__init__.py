"""pace's benchmarks as a package: ``pace bench <name>`` (see ``pace_core.bench.cli``)."""
