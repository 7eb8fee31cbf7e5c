"""Same as `pace bench attention [args]`; the code is in pace_core/bench/attention.py."""

from pace_core.bench.attention import main

if __name__ == "__main__":
    main()
