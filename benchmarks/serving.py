"""Same as `pace bench serving [args]`; the code is in bench/pace_bench/serving.py."""

from pace_bench.serving import main

if __name__ == "__main__":
    main()
