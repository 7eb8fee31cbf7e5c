"""Same as `pace bench kernels [args]`; the code is in bench/pace_bench/kernels.py."""

from pace_bench.kernels import main

if __name__ == "__main__":
    main()
