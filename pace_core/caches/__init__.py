"""KV caches. Each type is registered through ``pace_register_kv_caches``."""
