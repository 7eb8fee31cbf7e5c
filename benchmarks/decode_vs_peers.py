"""Same as `pace bench decode_vs_peers [args]` (code: pace_core/bench/decode_vs_peers.py)."""

from pace_core.bench.decode_vs_peers import main

if __name__ == "__main__":
    main()
