"""Same as `pace bench serving [args]`; the code is in pace_core/bench/serving.py."""

from pace_core.bench.serving import main

if __name__ == "__main__":
    main()
