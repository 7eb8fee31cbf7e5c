"""pace's benchmarks as a package: ``pace bench <name>`` (see ``pace_bench.cli``)."""
