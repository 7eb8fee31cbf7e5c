"""Same as `pace bench decode_vs_peers [args]` (code: bench/pace_bench/decode_vs_peers.py)."""

from pace_bench.decode_vs_peers import main

if __name__ == "__main__":
    main()
