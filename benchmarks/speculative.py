"""Same as `pace bench speculative [args]`; the code is in pace_core/bench/speculative.py."""

from pace_core.bench.speculative import main

if __name__ == "__main__":
    main()
