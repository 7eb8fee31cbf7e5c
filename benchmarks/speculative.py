"""Same as `pace bench speculative [args]`; the code is in bench/pace_bench/speculative.py."""

from pace_bench.speculative import main

if __name__ == "__main__":
    main()
