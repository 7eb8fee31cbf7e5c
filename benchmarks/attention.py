"""Same as `pace bench attention [args]`; the code is in bench/pace_bench/attention.py."""

from pace_bench.attention import main

if __name__ == "__main__":
    main()
