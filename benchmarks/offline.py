"""Same as `pace bench offline [args]`; the code is in bench/pace_bench/offline.py."""

from pace_bench.offline import main

if __name__ == "__main__":
    main()
