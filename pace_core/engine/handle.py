"""What the engine core needs of a loaded model, and nothing else of ``LLMModel``."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from pace_core.caches.base import BlockKVCache, KVCache
from pace_core.errors import ConfigError
from pace_core.models.decoder import DecoderLM
from pace_core.models.embedding import EmbeddingHead
from pace_core.models.limits import max_positions, serving_context_window
from pace_core.registry import ProcessorSpec
from pace_core.sampling.grammar import GrammarCompiler
from pace_core.speculative.speculator import Speculator


@dataclass(frozen=True)
class ModelHandle:
    """A loaded model as the core drives it.

    ``grammar`` builds the structured-output compiler on first use (None without a
    tokenizer); ``embedding`` the embedding head on first use (it raises why the model
    cannot embed); ``kv_namespace`` names what besides the tokens decides a KV block (model,
    dtype, quantization), for prefix caching.
    """

    decoder: DecoderLM
    tokenizer: Any | None
    new_cache: Callable[..., KVCache]
    kv_cache_type: str
    kv_namespace: bytes
    eos_token_ids: tuple[int, ...]
    processors: Sequence[ProcessorSpec]
    grammar: Callable[[], GrammarCompiler | None]
    embedding: Callable[[], EmbeddingHead]
    speculator: Speculator | None = None
    attach_disk: Callable[[BlockKVCache], None] | None = None  # the prefix cache's disk tier

    @property
    def vocab_size(self) -> int:
        return self.decoder.vocab_size

    def serving_context(self) -> int:
        """Tokens one served sequence may hold (see
        :func:`~pace_core.models.limits.serving_context_window`)."""
        return serving_context_window(self.decoder.config)

    def offline_context(self) -> int | None:
        """Tokens one offline sequence may hold: the model's max positions (None: unknown)."""
        return max_positions(self.decoder.config)

    def serving_cache(self, prefix_caching: bool) -> BlockKVCache:
        """A new block cache for a serving engine, prefix caching on unless turned off."""
        cache = self.new_cache()
        if not isinstance(cache, BlockKVCache):
            raise ConfigError(
                f"kv_cache_type {self.kv_cache_type!r} cannot serve: continuous batching "
                "steps a changing subset of sequences, which needs a block cache; use "
                "'paged' or 'slab_pool'"
            )
        if prefix_caching:
            cache.enable_prefix_caching(self.kv_namespace)
            if self.attach_disk is not None:
                self.attach_disk(cache)
        return cache
