"""Same as `pace bench offline [args]`; the code is in pace_core/bench/offline.py."""

from pace_core.bench.offline import main

if __name__ == "__main__":
    main()
