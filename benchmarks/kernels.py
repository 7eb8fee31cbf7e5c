"""Same as `pace bench kernels [args]`; the code is in pace_core/bench/kernels.py."""

from pace_core.bench.kernels import main

if __name__ == "__main__":
    main()
