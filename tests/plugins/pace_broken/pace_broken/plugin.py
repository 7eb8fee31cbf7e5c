"""Entry point of pace-broken: fails on import, as a plugin with a missing native library would."""

raise RuntimeError("pace-broken is broken on purpose (simulated missing native library)")
