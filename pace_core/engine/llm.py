"""LLMModel: load a Hugging Face causal LM as it is and generate with pace kernels."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import cached_property
from typing import Any

import torch

from pace_core.binder import OpPlan
from pace_core.caches import KVCacheType
from pace_core.caches.base import BlockKVCache, KVCache
from pace_core.caches.blocks import BlockCache
from pace_core.caches.disk_tier import DEFAULT_DISK_GB
from pace_core.caches.kv_quant import AUTO
from pace_core.caches.prefix_disk import PrefixDisk
from pace_core.engine.beam import BeamHypothesis, beam_output, beam_search
from pace_core.engine.config import EngineConfig
from pace_core.engine.core import EngineCore
from pace_core.engine.events import Embedding, EmbedSpec, Event, SeqSpec, Token
from pace_core.engine.handle import ModelHandle
from pace_core.engine.inputs import checked_prompts
from pace_core.engine.kv_choice import choose_kv_cache
from pace_core.engine.offline import (
    OFFLINE_ENGINE,
    SEQUENCE_EVENTS,
    OfflineRun,
    SequenceCollector,
    StreamChunk,
    generation_output,
    spec_totals,
)
from pace_core.engine.output import GenerationOutput
from pace_core.errors import ConfigError, ContractError
from pace_core.models import loader
from pace_core.models.decoder import DecoderLM, score
from pace_core.models.embedding import EmbeddingHead, coerce_pooling
from pace_core.models.limits import (
    DEFAULT_CONTEXT,
    max_positions,
    read_generation_config,
    resolve_eos_ids,
)
from pace_core.models.loader import (
    build_model,
    load_config,
    parse_dtype,
    resolve_model_path,
)
from pace_core.opconfig import OperatorConfig
from pace_core.parallel import load as tp_load
from pace_core.parallel.config import TensorParallelConfig
from pace_core.plugins import get_host
from pace_core.profiling import OpProfiler
from pace_core.quant import QuantizationConfig, coerce_quantization
from pace_core.sampling.config import SamplingConfig
from pace_core.sampling.grammar import GrammarCompiler
from pace_core.speculative.config import PromptLookupConfig, SpecConfig, coerce_spec_config
from pace_core.speculative.inferencer import ModelInferencer
from pace_core.speculative.speculator import SpecModel, Speculator, load_draft_tokenizer

log = logging.getLogger("pace.engine")


class LLMModel:
    """A causal LM ready to generate.

    >>> model = LLMModel("smollm2", dtype=torch.bfloat16)
    >>> model.generate("Once upon a time", SamplingConfig(max_new_tokens=20)).texts[0]
    """

    def __init__(
        self,
        model: str | os.PathLike,
        tokenizer: Any | None = None,
        dtype: torch.dtype | str = torch.bfloat16,
        kv_cache_type: str | KVCacheType = KVCacheType.PAGED,
        opconfig: OperatorConfig | dict | str | None = None,
        spec_config: Any | None = None,
        *,
        strict: bool = True,
        load_tokenizer: bool = True,
        quiet: bool = False,
        kv_cache_memory_gb: float | None = None,
        max_cache_tokens: int | None = None,
        profile: bool | None = None,
        quantization: QuantizationConfig | str | dict | None = None,
        prefix_caching: bool | None = None,
        engine_config: EngineConfig | None = None,
        prefix_cache_dir: str | os.PathLike | None = None,
        prefix_cache_disk_gb: float = DEFAULT_DISK_GB,
        kv_cache_dtype: str | None = None,
        tensor_parallel: int | TensorParallelConfig | None = None,
    ) -> None:
        # validate before the (slow) load
        spec = None if spec_config is None else coerce_spec_config(spec_config)
        self.dtype = parse_dtype(dtype)
        self.quantization = coerce_quantization(quantization)
        self.host = get_host()
        kv = choose_kv_cache(
            self.host.caches, kv_cache_type, kv_cache_dtype, memory_gb=kv_cache_memory_gb,
            max_tokens=max_cache_tokens, prefix_caching=prefix_caching,
            prefix_cache_dir=prefix_cache_dir, prefix_cache_disk_gb=prefix_cache_disk_gb,
        )  # fmt: skip
        self.kv_cache_type, self.cache_spec, self.kv_cache_dtype = kv.name, kv.spec, kv.dtype
        self.cache_options, self.prefix_caching = kv.options, kv.prefix_caching
        # one rank per process (pace_core.parallel); 1: this process alone
        self.tensor_parallel = TensorParallelConfig.coerce(tensor_parallel)
        tp_load.check_options(
            self.tensor_parallel.size, self.kv_cache_type, self.cache_spec.layout, prefix_cache_dir
        )
        if engine_config is not None and not isinstance(engine_config, EngineConfig):
            raise ConfigError(
                f"engine_config must be a pace_core.engine.config.EngineConfig, not "
                f"{type(engine_config).__name__}"
            )
        # the knobs of generate's engine core: sequences at once, prompt tokens per step
        self.engine_config = engine_config or OFFLINE_ENGINE
        self._prefix_cache: BlockKVCache | None = None
        self._prefix_cache_in_use = False
        self.path = resolve_model_path(model)
        self.prefix_disk = None  # the prefix caches' disk tier
        if prefix_cache_dir is not None:
            self.prefix_disk = PrefixDisk(prefix_cache_dir, prefix_cache_disk_gb, self.path)
        self.config = load_config(self.path)
        self.opconfig = OperatorConfig.coerce(opconfig)
        if profile is None:
            profile = os.environ.get("PACE_PROFILE", "") not in ("", "0")
        self.profiler = OpProfiler() if profile else None
        self.resolver = self.host.resolver(self.opconfig)
        build = build_model if self.tensor_parallel.size == 1 else self._build_sharded
        self.model: DecoderLM = build(
            self.path,
            self.config,
            self.dtype,
            self.host,
            self.resolver,
            strict=strict,
            quiet=quiet,
            cache_layout=self.cache_spec.layout,
            profiler=self.profiler,
            quantization=self.quantization,
            kv_dtype=None if self.kv_cache_dtype == AUTO else self.kv_cache_dtype,
        )
        if not isinstance(self.model, DecoderLM):  # a TransformersDecoder (no pace family)
            self.model.compile_now(lambda: self.new_cache(max_tokens=256))
        if self.model.value_dims is not None and not self.cache_spec.value_dims:
            raise ConfigError(
                f"kv_cache_type {self.kv_cache_type!r} does not take value_dims, which this "
                f"{self.config.model_type} model's latent cache rows need; use a built-in type"
            )
        if self.model.value_dims is not None and self.kv_cache_dtype != AUTO:
            raise ConfigError(
                f"kv_cache_dtype {self.kv_cache_dtype!r} does not cover the latent (MLA) cache "
                f"rows of this {self.config.model_type} model; use kv_cache_dtype 'auto'"
            )
        # after the weights: its heap does not add to their peak
        self.tokenizer = loader.tokenizer_for(tokenizer, self.path if load_tokenizer else None)
        gen = self.generation_config = read_generation_config(self.path)
        self.eos_token_ids = resolve_eos_ids(gen, self.model.config, self.tokenizer)
        self.speculator = None if spec is None else self._speculator(spec)
        self._grammar: GrammarCompiler | None = None

    def close(self) -> None:
        """Stop the other tensor-parallel ranks (nothing otherwise); the model cannot run
        after it."""
        close = getattr(self.model, "close", None)
        if close is not None:
            close()

    @property
    def grammar(self) -> GrammarCompiler | None:
        """Structured-output matchers for this model's tokenizer (None without a tokenizer);
        built on first use."""
        if self._grammar is None and self.tokenizer is not None and self.eos_token_ids:
            self._grammar = GrammarCompiler(
                self.tokenizer, self.model.vocab_size, self.eos_token_ids
            )
        return self._grammar

    # -- set-up helpers ------------------------------------------------------------------
    def _build_sharded(self, *args: Any, **kwargs: Any) -> DecoderLM:
        """Rank 0's shard, the other ranks started (``tensor_parallel`` > 1)."""
        return tp_load.load_tensor_parallel(
            self.tensor_parallel, *args, kv_cache_type=self.kv_cache_type,
            opconfig=self.opconfig, cache_options=self.cache_options, **kwargs,
        )  # fmt: skip

    @property
    def kv_namespace(self) -> bytes:
        """What besides the tokens decides a KV block: model, dtype, quantization (and the KV
        storage dtype when it is not the model's)."""
        kv = "" if self.kv_cache_dtype == AUTO else f"|kv={self.kv_cache_dtype}"
        return f"{self.path}|{self.dtype}|{self.quantization}{kv}".encode()

    def generation_cache(self) -> KVCache:
        """The cache of one :meth:`generate`: with prefix caching the model's persistent
        prefix-caching cache (blocks of earlier calls are reused), unless another generation
        is still using it; else a new cache."""
        if not self.prefix_caching:
            return self.new_cache()
        if self._prefix_cache is None:
            cache = self.new_cache()
            if not isinstance(cache, BlockKVCache):  # a factory function, not a checked class
                raise ContractError(
                    f"kv_cache_type {self.kv_cache_type!r} declares a block layout but its "
                    f"cache ({type(cache).__name__}) is not a BlockKVCache"
                )
            cache.enable_prefix_caching(self.kv_namespace)
            if self.prefix_disk is not None:
                self.prefix_disk.attach(cache)
            self._prefix_cache = cache
        if self._prefix_cache_in_use:  # a generation in progress (an unfinished stream)
            return self.new_cache()
        return self._prefix_cache

    def _speculator(self, spec: SpecConfig) -> Speculator:
        """Load the draft model the method needs (if any) and hand both models over."""
        draft = None
        if not isinstance(spec, PromptLookupConfig):
            source = spec.model_name_or_path
            llm = source if isinstance(source, LLMModel) else self._load_draft(source)
            tokenizer = llm.tokenizer
            if tokenizer is None and self.tokenizer is not None:
                tokenizer = load_draft_tokenizer(llm.path)
            draft = SpecModel(llm.model, llm.new_cache, tokenizer, str(llm.path))
        target = SpecModel(self.model, self.new_cache, self.tokenizer, str(self.path))
        return Speculator(spec, target, draft)

    def _load_draft(self, source: str | os.PathLike) -> LLMModel:
        """A draft with this model's dtype, cache type, kernels and cache budget."""
        return LLMModel(
            source,
            dtype=self.dtype,
            kv_cache_type=self.kv_cache_type,
            opconfig=self.opconfig,
            load_tokenizer=False,
            quiet=True,
            kv_cache_memory_gb=self.cache_options["memory_gb"],
            max_cache_tokens=self.cache_options["max_tokens"],
            kv_cache_dtype=self.kv_cache_dtype,
        )

    @property
    def inferencer(self) -> ModelInferencer:
        """This model as a speculative-decoding ``Inferencer`` (prefill / decode on KV rows)."""
        return ModelInferencer(self.model, self.new_cache)

    @cached_property
    def handle(self) -> ModelHandle:
        """This model as the engine core drives it."""
        return ModelHandle(
            decoder=self.model,
            tokenizer=self.tokenizer,
            new_cache=self.new_cache,
            kv_cache_type=self.kv_cache_type,
            kv_namespace=self.kv_namespace,
            eos_token_ids=self.eos_token_ids,
            processors=tuple(self.host.samplers.values()),
            grammar=lambda: self.grammar,
            embedding=lambda: self.embedding_head,
            attach_disk=None if self.prefix_disk is None else self.prefix_disk.attach,
            speculator=self.speculator,
        )

    @cached_property
    def embedding_head(self) -> EmbeddingHead:
        """How :meth:`embed` turns states into vectors (its ``config``: the pooling rules,
        :mod:`pace_core.models.embedding`); raises why the model cannot embed."""
        return EmbeddingHead.for_model(self.model, self.path, self.config)

    @property
    def op_plan(self) -> OpPlan:
        """Which backend serves each op call site, with fallback reasons."""
        return self.model.plan

    def new_cache(self, **options: Any) -> Any:
        """An empty KV cache of this model's ``kv_cache_type``; ``options`` override the
        model's cache budget (``max_tokens``, ``memory_gb``) or pass cache-specific ones
        (``block_size`` of the block caches)."""
        max_len = max_positions(self.model.config) or DEFAULT_CONTEXT
        if self.model.value_dims is not None:  # only then: caches of plugins may not know it
            options = {"value_dims": self.model.value_dims, **options}
        return self.cache_spec.factory(
            self.model.num_kv_heads,
            self.model.head_dims,
            self.dtype,
            max_seq_len=max_len,
            **{**self.cache_options, **options},
        )

    def sampling_defaults(self, **overrides: Any) -> SamplingConfig:
        """A SamplingConfig from the model's generation_config.json, then ``overrides``."""
        return SamplingConfig.from_generation_config(self.generation_config, **overrides)

    def _configs(self, sampling: SamplingConfig | Sequence[SamplingConfig] | None, n: int):
        if sampling is None:
            return [self.sampling_defaults()] * n
        if isinstance(sampling, SamplingConfig):
            return [sampling] * n
        configs = list(sampling) if isinstance(sampling, list | tuple) else [sampling]
        if not all(isinstance(c, SamplingConfig) for c in configs):
            raise ConfigError(f"sampling_config must be SamplingConfig(s), not {sampling!r}")
        if len(configs) != n:
            raise ConfigError(f"got {len(configs)} sampling configs for {n} prompts")
        return configs

    # -- generation ------------------------------------------------------------------------
    def _prompts(
        self, inputs: Any, *, generating: bool = True
    ) -> tuple[list[torch.Tensor], torch.Tensor | None]:
        max_ctx = max_positions(self.model.config)
        return checked_prompts(
            inputs, self.tokenizer, self.model.vocab_size, max_ctx, generating=generating
        )

    def _core(self, *, keep_logits: bool = False) -> EngineCore:
        """A new offline engine core over this model's generation cache."""
        cache = self.generation_cache()
        engine = self.engine_config
        if isinstance(cache, BlockKVCache):
            engine = replace(engine, prefix_caching=cache.prefix_caching)
        return EngineCore(self.handle, engine, cache=cache, offline=True, keep_logits=keep_logits)

    def _start(self, inputs: Any, sampling: Any, *, keep_logits: bool = False) -> OfflineRun:
        """Validate inputs and submit every prompt to a new engine core."""
        prompts, padded = self._prompts(inputs)
        configs = self._configs(sampling, len(prompts))
        if any(cfg.num_beams > 1 for cfg in configs):
            raise ConfigError("beam search: generate(inputs, one SamplingConfig), not stream")
        core = self._core(keep_logits=keep_logits)
        specs = [SeqSpec(str(i), p.tolist(), c) for i, (p, c) in enumerate(zip(prompts, configs))]
        core.submit(specs)
        return OfflineRun(prompts, padded, configs, core)

    def _drive(self, core: EngineCore) -> Iterator[Event]:
        """Every event of an offline core's run, in order."""
        in_use = core.cache is self._prefix_cache
        self._prefix_cache_in_use |= in_use
        try:
            for events in core.drive():
                yield from events
        finally:
            if in_use:
                self._prefix_cache_in_use = False
            if isinstance(core.cache, BlockCache) and core.cache.disk is not None:
                core.cache.disk.spill()  # written in the background

    def _events(self, run: OfflineRun) -> Iterator[Event]:
        """The sequences' events (:data:`~pace_core.engine.offline.SEQUENCE_EVENTS`), in order."""
        for ev in self._drive(run.core):
            if isinstance(ev, SEQUENCE_EVENTS):
                yield ev

    @torch.inference_mode()
    def embed(
        self,
        inputs: Any,
        *,
        pooling: str | Sequence[str] | None = None,
        normalize: bool | None = None,
        dimensions: int | None = None,
    ) -> torch.Tensor:
        """Embeddings ``[N, D]`` (float32) of one text or a batch (texts, token id lists or
        tensors), through the engine core like :meth:`generate`'s prompts.

        By default pooled as the model's sentence-transformers files say (else its last
        token's state, normalised; see :mod:`pace_core.models.embedding`; their default
        prompt is prepended to texts). ``pooling`` overrides the mode (``"last"``,
        ``"mean"``, ``"cls"``, ``"max"``, ...), ``normalize`` the L2 normalisation, and
        ``dimensions`` cuts the vector (models trained for it only).
        """
        config = self.embedding_head.config
        config.check_dimensions(dimensions)
        spec = EmbedSpec(coerce_pooling(pooling), normalize, dimensions)
        prompts, _ = self._prompts(config.with_prompt(inputs), generating=False)
        core = self._core()
        default = self.sampling_defaults()
        core.submit(
            [SeqSpec(str(i), p.tolist(), default, embed=spec) for i, p in enumerate(prompts)]
        )
        vectors: list[torch.Tensor | None] = [None] * len(prompts)
        for ev in self._drive(core):
            if isinstance(ev, Embedding):
                vectors[int(ev.key)] = ev.vector
        return torch.stack(vectors)

    @torch.inference_mode()
    def generate(
        self,
        inputs: Any,
        sampling_config: SamplingConfig | Sequence[SamplingConfig] | None = None,
        streamer: Any | None = None,
        *,
        output_logits: bool = False,
    ) -> GenerationOutput:
        """Generate for one prompt or a batch; see :class:`GenerationOutput`.

        The prompts stream through the engine core (a bounded running set, chunked prefill,
        prefix caching on block caches), so a call may hold any number of prompts.
        ``streamer`` follows transformers' streamer protocol (``put``/``end``; batch size 1).
        With ``num_beams > 1`` this runs beam search and returns the best beam per prompt.
        """
        if isinstance(sampling_config, SamplingConfig) and sampling_config.num_beams > 1:
            if streamer is not None or output_logits:
                raise ConfigError("beam search does not stream or return logits")
            prompts, padded = self._prompts(inputs)
            best = [h[0] for h in self.beam_search(prompts, sampling_config)]
            eos = set(sampling_config.eos_token_ids or self.eos_token_ids)
            return beam_output(prompts, padded, best, eos, self.tokenizer, self._pad_id)
        run = self._start(inputs, sampling_config, keep_logits=output_logits)
        prompts = run.prompts
        if streamer is not None and len(prompts) > 1:
            raise ConfigError(f"a streamer takes 1 prompt, not {len(prompts)}: use stream()")
        rows = [SequenceCollector(c, self.tokenizer is not None) for c in run.configs]
        if streamer is not None:
            streamer.put(prompts[0].view(1, -1) if len(prompts) == 1 else torch.stack(prompts))
        for ev in self._events(run):
            rows[int(ev.key)].add(ev)
            if streamer is not None and isinstance(ev, Token):
                streamer.put(torch.tensor([ev.token]))
        if streamer is not None:
            streamer.end()
        stats = spec_totals(rows, run.core.spec)
        if stats is not None:
            self.speculator.stats.merge(stats)
        return generation_output(run, rows, self._pad_id, output_logits, stats)

    @torch.inference_mode()
    def beam_search(
        self, inputs: Any, sampling_config: SamplingConfig, num_return_sequences: int = 1
    ) -> list[list[BeamHypothesis]]:
        """Beam search with transformers' semantics: the best ``num_return_sequences``
        hypotheses (generated ids and score) per prompt, best first."""
        prompts, _ = self._prompts(inputs)
        eos = sampling_config.eos_token_ids or self.eos_token_ids
        return beam_search(
            self.model,
            self.new_cache,
            prompts,
            sampling_config,
            list(eos),
            self.host.samplers.values(),
            num_return_sequences,
        )

    @torch.inference_mode()
    def stream(
        self, inputs: Any, sampling_config: SamplingConfig | Sequence[SamplingConfig] | None = None
    ) -> Iterator[StreamChunk]:
        """Yield each new token with its text delta (UTF-8 safe, stop strings held back)."""
        run = self._start(inputs, sampling_config)
        for ev in self._events(run):
            if isinstance(ev, Token):
                yield StreamChunk(int(ev.key), ev.token, ev.text, ev.finish_reason)

    @property
    def _pad_id(self) -> int:
        """What pads ``output_token_ids``: the tokenizer's pad id, else the first EOS id."""
        pad = getattr(self.tokenizer, "pad_token_id", None)
        return pad if pad is not None else (self.eos_token_ids[0] if self.eos_token_ids else 0)

    @torch.inference_mode()
    def logits(self, inputs: Any) -> torch.Tensor:
        """Raw logits ``[B, T, V]`` for every position of the (left-padded) prompts."""
        prompts, _ = checked_prompts(inputs, self.tokenizer, self.model.vocab_size, None)
        return score(self.model, self.new_cache(), prompts)  # (no room kept for a new token)
