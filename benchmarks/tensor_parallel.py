"""Same as `pace bench tensor_parallel [args]`; the code is in
bench/pace_bench/tensor_parallel.py."""

from pace_bench.tensor_parallel import main

if __name__ == "__main__":
    main()
