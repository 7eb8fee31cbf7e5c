"""LLMModel: load a Hugging Face causal LM as it is and generate with pace kernels."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from pace_core.caches import KVCacheType
from pace_core.engine.beam import BeamHypothesis, beam_search
from pace_core.engine.generate import StepEvent, generation_loop, left_pad, score
from pace_core.engine.inputs import normalize_inputs
from pace_core.engine.output import GenerationOutput, SequenceOutput, TokenLogprob
from pace_core.engine.sequence import SequenceTracker
from pace_core.engine.shared_prefill import prefill_sharing
from pace_core.errors import ConfigError
from pace_core.models import loader
from pace_core.models.builder import OpPlan
from pace_core.models.decoder import DecoderLM
from pace_core.models.limits import DEFAULT_CONTEXT, max_positions, read_generation_config
from pace_core.models.loader import (
    build_model,
    load_config,
    parse_dtype,
    resolve_model_path,
)
from pace_core.opconfig import OperatorConfig
from pace_core.plugins import get_host
from pace_core.profiling import OpProfiler
from pace_core.quant import QuantizationConfig, coerce_quantization
from pace_core.sampling.config import SamplingConfig
from pace_core.sampling.grammar import GrammarCompiler
from pace_core.sampling.sampler import BatchSampler
from pace_core.speculative.config import PromptLookupConfig, SpecConfig, coerce_spec_config
from pace_core.speculative.inferencer import ModelInferencer
from pace_core.speculative.loop import SpeculativeRun
from pace_core.speculative.speculator import SpecModel, Speculator, load_draft_tokenizer

log = logging.getLogger("pace.engine")


@dataclass
class _Batch:
    """One batch as :meth:`LLMModel._start` sets it up: its event stream and bookkeeping."""

    prompts: list[torch.Tensor]
    padded: torch.Tensor | None  # the caller's padded input_ids, if any
    trackers: list[SequenceTracker]
    deltas: dict[int, str]  # row -> text delta of its latest token
    events: Iterable[StepEvent]
    spec_run: SpeculativeRun | None = None  # the same stream, when decoding speculatively


@dataclass
class StreamChunk:
    """One token of one sequence, as yielded by :meth:`LLMModel.stream`."""

    index: int
    token_id: int
    text: str
    finish_reason: str | None


def _tokens_needed(
    prompts: Sequence[torch.Tensor], configs: Sequence[SamplingConfig], limit: int | None
) -> int:
    """Cache tokens per row a batch can reach: its longest prompt plus generation budget."""
    most = max(p.numel() + c.max_new_tokens for p, c in zip(prompts, configs))
    return min(most, limit) if limit else most


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
        kv_cache_type: str | KVCacheType = KVCacheType.DYNAMIC,
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
    ) -> None:
        # validate before the (slow) load
        spec = None if spec_config is None else coerce_spec_config(spec_config)
        self.dtype = parse_dtype(dtype)
        self.quantization = coerce_quantization(quantization)
        self.host = get_host()
        if kv_cache_type not in self.host.caches:
            raise ConfigError(
                f"unknown kv_cache_type {kv_cache_type!r}; available: "
                f"{', '.join(sorted(self.host.caches))}"
            )
        self.kv_cache_type = str(kv_cache_type)  # a KVCacheType member is its name
        self.cache_spec = self.host.caches[kv_cache_type]
        self.cache_options = {"memory_gb": kv_cache_memory_gb, "max_tokens": max_cache_tokens}
        self.prefix_caching = self._prefix_caching_choice(prefix_caching)
        self._prefix_cache: Any | None = None
        self.path = resolve_model_path(model)
        self.config = load_config(self.path)
        self.opconfig = OperatorConfig.coerce(opconfig)
        if profile is None:
            profile = os.environ.get("PACE_PROFILE", "") not in ("", "0")
        self.profiler = OpProfiler() if profile else None
        self.resolver = self.host.resolver(self.opconfig)
        self.model: DecoderLM = build_model(
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
        )
        if self.model.value_dims is not None and not self.cache_spec.value_dims:
            raise ConfigError(
                f"kv_cache_type {self.kv_cache_type!r} does not take value_dims, which this "
                f"{self.config.model_type} model's latent cache rows need; use a built-in type"
            )
        self.tokenizer = tokenizer  # after the weights: its heap does not add to their peak
        if tokenizer is None and load_tokenizer:
            self.tokenizer = loader.load_tokenizer(self.path)
        self.generation_config = read_generation_config(self.path)
        self.eos_token_ids = self._default_eos()
        self.speculator = None if spec is None else self._speculator(spec)
        self._grammar: GrammarCompiler | None = None

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
    def _prefix_caching_choice(self, asked: bool | None) -> bool:
        """On by default for the block caches (the only ones that can share blocks)."""
        blocks = self.cache_spec.layout in ("paged", "slab")
        if asked and not blocks:
            raise ConfigError(
                f"prefix_caching needs a block cache (kv_cache_type 'paged' or 'slab_pool'), "
                f"not {self.kv_cache_type!r}"
            )
        return blocks if asked is None else bool(asked)

    @property
    def kv_namespace(self) -> bytes:
        """What besides the tokens decides a KV block: model, dtype, quantization."""
        return f"{self.path}|{self.dtype}|{self.quantization}".encode()

    def generation_cache(self) -> Any:
        """The cache of one :meth:`generate`: with prefix caching the model's persistent
        prefix-caching cache (blocks of earlier calls are reused), unless another generation
        is still using it; else a new cache."""
        if not self.prefix_caching:
            return self.new_cache()
        if self._prefix_cache is None:
            cache = self.new_cache()
            if not hasattr(cache, "enable_prefix_caching"):  # a plugin's block cache
                self.prefix_caching = False
                return cache
            cache.enable_prefix_caching(self.kv_namespace)
            self._prefix_cache = cache
        if self._prefix_cache.lens:  # a generation in progress (an unfinished stream)
            return self.new_cache()
        return self._prefix_cache

    def _default_eos(self) -> tuple[int, ...]:
        for source in (
            self.generation_config.get("eos_token_id"),
            getattr(self.model.config, "eos_token_id", None),
            getattr(self.tokenizer, "eos_token_id", None),
        ):
            if source is not None:
                return tuple(source) if isinstance(source, list | tuple) else (int(source),)
        return ()

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
        )

    @property
    def inferencer(self) -> ModelInferencer:
        """This model as a speculative-decoding ``Inferencer`` (prefill / decode on KV rows)."""
        return ModelInferencer(self.model, self.new_cache)

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
        configs = list(sampling)
        if len(configs) != n:
            raise ConfigError(f"got {len(configs)} sampling configs for {n} prompts")
        return configs

    # -- generation ------------------------------------------------------------------------
    def _start(self, inputs: Any, sampling: Any, *, keep_logits: bool = False) -> _Batch:
        """Validate inputs and set up trackers and the generation loop."""
        prompts, padded = normalize_inputs(inputs, self.tokenizer)
        for i, p in enumerate(prompts):
            if p.numel() == 0:
                raise ConfigError(f"prompt {i} is empty: every prompt needs at least one token")
            bad = p[(p < 0) | (p >= self.model.vocab_size)]
            if bad.numel():
                raise ConfigError(
                    f"prompt {i} has token id {int(bad[0])} outside the vocabulary "
                    f"[0, {self.model.vocab_size})"
                )
        configs = self._configs(sampling, len(prompts))
        max_ctx = max_positions(self.model.config)
        for i, (cfg, p) in enumerate(zip(configs, prompts)):
            if cfg.num_beams > 1:
                raise ConfigError("num_beams > 1 needs one SamplingConfig for the whole batch")
            if max_ctx and p.numel() >= max_ctx:
                raise ConfigError(
                    f"prompt {i} has {p.numel()} tokens; the model's context window is {max_ctx}"
                )
        trackers = [
            SequenceTracker(cfg, p.numel(), self.tokenizer, max_ctx)
            for cfg, p in zip(configs, prompts)
        ]
        deltas: dict[int, str] = {}

        def finish(row: int, token: int, hit_eos: bool, hit_length: bool) -> str | None:
            deltas[row] = trackers[row].add(token, hit_eos, hit_length)
            return trackers[row].finish_reason

        sampler = BatchSampler(
            configs,
            prompts,
            self.model.vocab_size,
            self.eos_token_ids,
            processors=self.host.samplers.values(),
            grammar=self.grammar if any(c.constrained for c in configs) else None,
        )
        if self.speculator is not None:
            run = self.speculator.run(prompts, sampler, finish, keep_logits=keep_logits)
            return _Batch(prompts, padded, trackers, deltas, run, run)
        events = generation_loop(
            self.model,
            self.generation_cache(),
            prompts,
            sampler,
            finish,
            keep_logits=keep_logits,
            first_prefill=prefill_sharing,
            reserve=_tokens_needed(prompts, configs, max_ctx),
        )
        return _Batch(prompts, padded, trackers, deltas, events)

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

        ``streamer`` follows transformers' streamer protocol (``put``/``end``; batch size 1).
        With ``num_beams > 1`` this runs beam search and returns the best beam per prompt.
        """
        if isinstance(sampling_config, SamplingConfig) and sampling_config.num_beams > 1:
            if streamer is not None or output_logits:
                raise ConfigError("beam search does not stream or return logits")
            prompts, padded = normalize_inputs(inputs, self.tokenizer)
            best = [h[0] for h in self.beam_search(prompts, sampling_config)]
            sequences = [
                SequenceOutput(
                    p.tolist(),
                    h.token_ids,
                    self._decode(h.token_ids),
                    self._beam_reason(h, sampling_config),
                )
                for p, h in zip(prompts, best)
            ]
            tokens = self._pack(prompts, padded, [h.token_ids for h in best])
            return GenerationOutput(tokens, sequences)
        batch = self._start(inputs, sampling_config, keep_logits=output_logits)
        prompts, trackers, spec_run = batch.prompts, batch.trackers, batch.spec_run
        if streamer is not None:
            streamer.put(prompts[0].view(1, -1) if len(prompts) == 1 else torch.stack(prompts))
        logits: list[list[torch.Tensor]] = [[] for _ in prompts]
        for event in batch.events:
            self._record(event, trackers, logits)
            if streamer is not None:
                streamer.put(torch.tensor(event.tokens))
        if streamer is not None:
            streamer.end()
        prompt_lp = self._prompt_logprobs(prompts, [t.config for t in trackers])
        row_stats = spec_run.row_stats if spec_run is not None else None
        sequences = [
            SequenceOutput(
                p.tolist(),
                t.tokens,
                t.text,
                t.finish_reason or "length",
                t.logprobs if t.config.logprobs is not None else None,
                prompt_lp[i],
                row_stats[i] if row_stats is not None else None,
            )
            for i, (p, t) in enumerate(zip(prompts, trackers))
        ]
        out_logits = [torch.stack(rows) for rows in logits] if output_logits else None
        generated = [t.tokens for t in trackers]
        return GenerationOutput(
            self._pack(prompts, batch.padded, generated),
            sequences,
            out_logits,
            spec_run.stats if spec_run is not None else None,
        )

    @torch.inference_mode()
    def beam_search(
        self, inputs: Any, sampling_config: SamplingConfig, num_return_sequences: int = 1
    ) -> list[list[BeamHypothesis]]:
        """Beam search with transformers' semantics: the best ``num_return_sequences``
        hypotheses (generated ids and score) per prompt, best first."""
        prompts, _ = normalize_inputs(inputs, self.tokenizer)
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

    def _decode(self, tokens: list[int]) -> str | None:
        if self.tokenizer is None:
            return None
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def _beam_reason(self, hyp: BeamHypothesis, config: SamplingConfig) -> str:
        eos = set(config.eos_token_ids or self.eos_token_ids)
        return "stop" if hyp.token_ids and hyp.token_ids[-1] in eos else "length"

    @torch.inference_mode()
    def stream(
        self, inputs: Any, sampling_config: SamplingConfig | Sequence[SamplingConfig] | None = None
    ) -> Iterator[StreamChunk]:
        """Yield each new token with its text delta (UTF-8 safe, stop strings held back)."""
        batch = self._start(inputs, sampling_config)
        trackers, deltas = batch.trackers, batch.deltas
        for event in batch.events:
            for row, token in zip(event.rows, event.tokens):
                yield StreamChunk(row, token, deltas.pop(row, ""), trackers[row].finish_reason)

    # -- output helpers --------------------------------------------------------------------
    @staticmethod
    def _record(event: StepEvent, trackers: list[SequenceTracker], logits) -> None:
        for j, row in enumerate(event.rows):
            if event.logits is not None:
                logits[row].append(event.logits[j])
            k = trackers[row].config.logprobs
            if k is not None and event.logprobs is not None:
                top = {}
                if k and event.top_ids is not None:
                    ids, values = event.top_ids[j, :k].tolist(), event.top_logprobs[j, :k].tolist()
                    top = {i: v for i, v in zip(ids, values) if i >= 0}
                trackers[row].logprobs.append(
                    TokenLogprob(event.tokens[j], float(event.logprobs[j]), top)
                )

    def _prompt_logprobs(self, prompts, configs) -> list[list[TokenLogprob | None] | None]:
        wanted = [i for i, c in enumerate(configs) if c.prompt_logprobs is not None]
        result: list[list[TokenLogprob | None] | None] = [None] * len(prompts)
        if not wanted:
            return result
        batch = [prompts[i] for i in wanted]
        logits = score(self.model, self.new_cache(), batch)
        width = logits.shape[1]
        for j, i in enumerate(wanted):
            n, k = prompts[i].numel(), configs[i].prompt_logprobs
            lp = torch.log_softmax(logits[j, width - n : width - 1], dim=-1)
            entries: list[TokenLogprob | None] = [None]
            for t in range(n - 1):
                top = {}
                if k:
                    best = lp[t].topk(k)
                    top = dict(zip(best.indices.tolist(), best.values.tolist()))
                token = int(prompts[i][t + 1])
                entries.append(TokenLogprob(token, float(lp[t, token]), top))
            result[i] = entries
        return result

    def _pack(
        self, prompts, padded: torch.Tensor | None, generated: list[list[int]]
    ) -> torch.Tensor:
        pad = getattr(self.tokenizer, "pad_token_id", None)
        pad = pad if pad is not None else (self.eos_token_ids[0] if self.eos_token_ids else 0)
        if padded is None:
            padded = left_pad(prompts, pad)[0]
        width = max(len(g) for g in generated)
        tail = torch.full((len(prompts), width), pad, dtype=torch.long)
        for i, g in enumerate(generated):
            tail[i, : len(g)] = torch.tensor(g, dtype=torch.long)
        return torch.cat([padded, tail], dim=1)

    @torch.inference_mode()
    def logits(self, inputs: Any) -> torch.Tensor:
        """Raw logits ``[B, T, V]`` for every position of the (left-padded) prompts."""
        prompts, _ = normalize_inputs(inputs, self.tokenizer)
        return score(self.model, self.new_cache(), prompts)
