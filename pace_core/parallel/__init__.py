"""Tensor parallelism: one model split across ranks (processes), one per NUMA node.

SGLang's CPU layout: Q/K/V and gate/up are column-parallel (each rank its heads and its part
of the intermediate size), the output projection and down projection row-parallel and
followed by one all-reduce each, the KV heads (and so the KV cache) sharded, the LM head
vocab-parallel (the logits gathered on rank 0), embeddings and norms replicated.

- :mod:`~pace_core.parallel.config`: what is asked (:class:`TensorParallelConfig`);
- :mod:`~pace_core.parallel.shard`: which models can be split N ways, the per-rank config
  and which part of each checkpoint tensor a rank reads;
- :mod:`~pace_core.parallel.comm`: the rank group (gloo) and the step messages;
- :mod:`~pace_core.parallel.shm`: the all-reduce and gather over shared memory;
- :mod:`~pace_core.parallel.builder`: the model builder of one rank's shard;
- :mod:`~pace_core.parallel.load`: building a shard, starting a group from ``LLMModel``;
- :mod:`~pace_core.parallel.model`: the sharded decoder (rank 0 drives, the others follow);
- :mod:`~pace_core.parallel.group`: starting, watching and stopping the other ranks;
- :mod:`~pace_core.parallel.worker`: the body of a rank > 0.

Serving groups (``pace serve --tensor-parallel``): :mod:`pace_core.server.launch.tensor_parallel`.
"""

from pace_core.parallel.config import TensorParallelConfig

__all__ = ["TensorParallelConfig"]
