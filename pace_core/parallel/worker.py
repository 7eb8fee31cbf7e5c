"""The body of a tensor-parallel rank > 0: ``python -m pace_core.parallel.worker`` with its
:class:`~pace_core.parallel.group.WorkerArgs` pickled on stdin (length-prefixed). It joins the
group, loads its shard and replays rank 0's forwards until stopped; it exits when its stdin
reaches EOF (rank 0's process is gone)."""

from __future__ import annotations

import logging
import os
import pickle
import sys
import threading
from typing import BinaryIO

import torch


def _read_args(stream: BinaryIO):
    size = int.from_bytes(stream.read(8), "little")
    return pickle.loads(stream.read(size))


def _exit_at_eof(stream: BinaryIO) -> None:
    while stream.read(65536):
        pass
    os._exit(0)


def main() -> int:
    stream = sys.stdin.buffer
    args = _read_args(stream)
    logging.basicConfig(
        level=logging.INFO, format=f"%(levelname)s rank {args.rank} %(name)s: %(message)s"
    )
    threading.Thread(target=_exit_at_eof, args=(stream,), daemon=True).start()

    from pace_core.caches.blocks import BlockCache
    from pace_core.models import heap
    from pace_core.models.limits import DEFAULT_CONTEXT, max_positions
    from pace_core.models.loader import load_config
    from pace_core.opconfig import OperatorConfig
    from pace_core.parallel.comm import Comm
    from pace_core.parallel.group import bind_rank
    from pace_core.parallel.load import build_shard
    from pace_core.parallel.model import follow
    from pace_core.plugins import get_host
    from pace_core.profiling import OpProfiler

    if args.bind:
        bind_rank(args.plan, args.rank)
    else:
        torch.set_num_threads(max(1, args.plan.omp_threads))
    comm = Comm(args.rank, args.size, port=args.port, shm=args.shm)
    m = args.model
    host = get_host()
    config = load_config(m["path"])
    resolver = host.resolver(OperatorConfig.coerce(m["opconfig"]))
    cache_spec = host.caches[m["kv_cache_type"]]
    model = build_shard(
        m["path"], config, m["dtype"], host, resolver, comm, cache_layout=cache_spec.layout,
        strict=m["strict"], quiet=True, quantization=m["quantization"],
        profiler=OpProfiler() if m.get("profile") else None, kv_dtype=m.get("kv_dtype"),
    )  # fmt: skip
    max_len = max_positions(model.config) or DEFAULT_CONTEXT

    def new_cache(num_blocks: int, block_size: int) -> BlockCache:
        extra = dict(m.get("cache_options") or {})
        if model.value_dims is not None:
            extra["value_dims"] = model.value_dims
        return cache_spec.factory(
            model.num_kv_heads, model.head_dims, m["dtype"], max_seq_len=max_len,
            max_tokens=num_blocks * block_size, block_size=block_size, memory_gb=None, **extra,
        )  # fmt: skip

    heap.keep_step_transients()
    with torch.inference_mode():
        follow(model, new_cache)
    comm.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
