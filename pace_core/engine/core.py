"""The engine core: the one loop behind ``LLMModel`` (generate, stream, embed) and ``pace serve``.

Each iteration (:meth:`EngineCore.step`): the
:class:`~pace_core.engine.scheduler.Scheduler` admits waiting sequences and plans this step's
prompt chunks; the :class:`~pace_core.engine.runner.ModelRunner` runs the running sequences'
next inputs and the chunks (one forward where the stack packs ragged rows); one
:class:`~pace_core.sampling.sampler.BatchSampler`, whose rows follow the running sequences,
picks the next tokens (or, with ``spec_config``, a speculative step of
:class:`~pace_core.engine.speculative.SpecDecoder`: drafts, one target forward,
verification, KV rollback); each token becomes a :class:`~pace_core.engine.events.Token`
event with the finish reason the tokens decide (EOS, ``max_new_tokens``, the context window)
and finished sequences free their KV at once; embeddings whose prompt completed leave as
:class:`~pace_core.engine.events.Embedding` events. The step's events get their text from
the :class:`~pace_core.engine.output_processor.OutputProcessor` (detokenization, stop
strings) as they leave the core.

Served (its thread: :meth:`run`), it takes commands from its inbox; offline, the caller
drives it (:meth:`drive`). Failures are :class:`~pace_core.engine.events.SeqError` events.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator

import torch

from pace_core.caches.base import BlockKVCache, KVCache
from pace_core.caches.blocks import BlockCache
from pace_core.engine.config import EngineConfig
from pace_core.engine.events import (
    Admitted,
    Cancel,
    Command,
    Embedding,
    ErrorKind,
    Event,
    PromptLogprobs,
    SeqError,
    SeqSpec,
    SpecStep,
    Stats,
    Stop,
    Submit,
    Token,
)
from pace_core.engine.handle import ModelHandle
from pace_core.engine.output_processor import OutputProcessor
from pace_core.engine.prefill_budget import PrefillBudget
from pace_core.engine.prompt_logprobs import PromptScorer
from pace_core.engine.runner import ModelRunner
from pace_core.engine.scheduler import Request, Scheduler
from pace_core.engine.speculative import RowVerdict, SpecDecoder
from pace_core.engine.warm_up import warm_up
from pace_core.errors import ConfigError
from pace_core.models import heap
from pace_core.sampling.sampler import BatchSampler, LogprobEntry, logprob_entries
from pace_core.speculative.verify import check_speculable, stop_flags

log = logging.getLogger("pace.engine.core")

Emit = Callable[[list[Event]], None]


def _ignore(events: list[Event]) -> None:
    """The emit of a core whose caller takes its events itself (offline)."""


class EngineCore:
    """The scheduler, runner and sampler of one model; see the module doc.

    Args:
        model: the model handle.
        config: scheduler knobs.
        emit: receives each iteration's events (served); offline, :meth:`drive` yields them.
        name: the instance's name in logs.
        cache: the KV cache to run on; default a new block cache (serving).
        offline: errors raise (a failed step, an invalid sequence) instead of failing the
            sequences in flight, and a sequence may hold the model's whole context (served:
            the serving window).
        keep_logits: each ``Token`` event carries the raw logits that chose it.
    """

    def __init__(
        self,
        model: ModelHandle,
        config: EngineConfig,
        emit: Emit = _ignore,
        name: str = "0",
        *,
        cache: KVCache | None = None,
        offline: bool = False,
        keep_logits: bool = False,
    ) -> None:
        self.model = model
        self.config = config
        self.emit = emit
        self.name = name
        self.offline = offline
        self.keep_logits = keep_logits
        self.max_context = model.offline_context() if offline else model.serving_context()
        self._own_cache = cache is None
        cache = model.serving_cache(config.prefix_caching) if cache is None else cache
        self.prefill_budget = PrefillBudget(config.max_prefill_tokens, config.prefill_slice_ms)
        self.scheduler = Scheduler(
            cache, config.max_running, self.prefill_budget, self.max_context,
            config.wait_for_shared_prefix,
        )  # fmt: skip
        continuous = self.scheduler.continuous
        packs = config.mixed_steps and model.decoder.packs_ragged_steps
        self.runner = ModelRunner(model.decoder, self.prefill_budget, packs or not continuous)
        self.spec = self._new_spec()
        self.inbox: queue.Queue = queue.Queue()
        self.sampler: BatchSampler | None = None
        self.steps = 0
        self._out: list[Event] = []
        self.output = OutputProcessor(model.tokenizer)
        self._stopped = False
        self.warmed = threading.Event()  # set by run once warmed up (or its warm-up failed)
        self._last_stats: Stats | None = None

    # -- geometry ----------------------------------------------------------------------------
    @property
    def cache(self) -> KVCache:
        return self.scheduler.cache

    @property
    def capacity_tokens(self) -> int | None:
        return self.scheduler.capacity_tokens

    @property
    def block_size(self) -> int:
        return self.scheduler.block_size

    @property
    def busy(self) -> bool:
        return self.scheduler.busy

    def _new_spec(self) -> SpecDecoder | None:
        speculates = self.model.speculator is not None
        return SpecDecoder(self.model, self.cache, self.max_context) if speculates else None

    # -- thread-safe entry points --------------------------------------------------------
    def submit(self, specs: list[SeqSpec]) -> None:
        self.inbox.put(Submit(specs))

    def cancel(self, keys: list[str]) -> None:
        self.inbox.put(Cancel(keys))

    def stop(self) -> None:
        self.inbox.put(Stop())

    # -- served: the thread body -----------------------------------------------------------
    def run(self, on_warm: Callable[[], None] | None = None) -> None:
        """The thread body: warm up, call ``on_warm``, then iterate until stopped."""
        try:
            if self.config.threads:
                torch.set_num_threads(self.config.threads)
            heap.keep_step_transients()
            self.warm_up()
        except Exception:  # serve anyway: the budget then measures its rate from requests
            log.exception("engine %s: warm-up failed", self.name)
        finally:
            self.warmed.set()
        if on_warm is not None:
            on_warm()
        with heap.loaded_objects_frozen():
            while not self._stopped:
                self.run_once(block=True)
        self._spill(final=True)
        self._fail_active("server is shutting down", ErrorKind.UNAVAILABLE)
        for req in self.scheduler.drop_waiting():
            self._out.append(SeqError(req.key, "server is shutting down", ErrorKind.UNAVAILABLE))
        self._flush()

    def warm_up(self) -> float | None:
        """Before serving: the pool committed and the prefill rate measured
        (:func:`~pace_core.engine.warm_up.warm_up`); returns the rate or None."""
        cache = self.cache
        if not isinstance(cache, BlockKVCache):
            return None
        return warm_up(self.model.decoder, cache, self.prefill_budget, self.max_context, self.name)

    def run_once(self, block: bool = False) -> bool:
        """One served iteration; with ``block``, first wait for work when idle. A failed step
        fails the sequences in flight and resets the engine. Returns whether a step ran."""
        if not self.busy:
            self._flush()
            self._spill()
        self._drain(block=block and not self.busy)
        if self._stopped or not self.busy:
            self._flush()  # e.g. rejections made while draining
            return False
        with torch.inference_mode():
            try:
                self.step()
            except Exception as exc:  # keep serving: fail what was in flight, reset
                log.exception("engine %s: step failed", self.name)
                self._fail_active(
                    f"engine step failed: {type(exc).__name__}: {exc}", ErrorKind.ENGINE_ERROR
                )
        self._flush()
        return True

    # -- offline: the caller's loop ----------------------------------------------------------
    def drive(self) -> Iterator[list[Event]]:
        """Step until every submitted sequence has finished, yielding each step's events
        (offline); commands sent while a step's events are handled (a ``cancel``) apply
        before the next step. Abandoning the iterator frees every sequence's KV."""
        try:
            self._drain(block=False)
            yield self._take()
            while self.busy:
                with torch.inference_mode():
                    self.step()
                yield self._take()
                self._drain(block=False)  # e.g. the cancels of sequences stop strings ended
        finally:
            self.abort()

    def abort(self) -> None:
        """Drop every sequence, waiting or active, and free their KV."""
        self.scheduler.drop_waiting()
        rows = list(range(len(self.scheduler.running)))
        if rows:
            self._remove_rows(rows)
        self.scheduler.cancel({r.key for r in self.scheduler.prefilling})

    def _take(self) -> list[Event]:
        """The events so far, with text; sequences a stop string ended leave the batch."""
        out, stopped = self.output.process(self._out)
        self._out = []
        if stopped:
            rows = self.scheduler.cancel(set(stopped))
            if rows:
                self._remove_rows(rows)
        return out

    # -- commands ------------------------------------------------------------------------------
    def _drain(self, block: bool) -> None:
        try:
            item = self.inbox.get() if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            self._handle(item)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _handle(self, command: Command) -> None:
        if isinstance(command, Submit):
            for spec in command.specs:
                if (problem := self.scheduler.add(spec)) is not None:
                    hint = "raise max_cache_tokens or kv_cache_memory_gb, or lower max_new_tokens"
                    self._invalid(spec.key, problem, hint=hint)
        elif isinstance(command, Cancel):
            for key in command.keys:
                self.output.forget(key)
            rows = self.scheduler.cancel(set(command.keys))
            if rows:
                self._remove_rows(rows)
        elif isinstance(command, Stop):
            self._stopped = True

    # -- one step --------------------------------------------------------------------------
    def step(self) -> None:
        """Admit, run one step's forwards, sample and emit (errors propagate)."""
        self._admit()
        sched = self.scheduler
        chunks = sched.chunks() if sched.prefilling else []
        if self.spec is not None:
            _, chunk_logits = self.runner.step(self.cache, [], chunks)
            self._spec_step(self._prefilled(chunks, chunk_logits))
            return
        decoded, chunk_logits = self.runner.step(self.cache, sched.running, chunks)
        self._sample(decoded, self._prefilled(chunks, chunk_logits))

    def _embedded(self, done: list[Request]) -> None:
        """Embeddings whose prompt completed: their vectors leave, their KV is freed."""
        head = self.model.embedding()
        for req in done:
            vector = head.finish(req.pool, req.spec.embed)
            self._out.append(Embedding(req.key, vector, req.prompt.numel()))
        self.scheduler.cancel({req.key for req in done})

    def _admit(self) -> None:
        now = time.monotonic()
        admitted, failed = self.scheduler.admit(self._prepare)
        for req in failed:
            self._invalid(req.key, f"invalid sampling parameters: {req.error}", error=req.error)
        for req in admitted:
            wait = max(0.0, now - req.spec.arrival)
            self._out.append(Admitted(req.key, wait, req.prompt.numel(), req.computed))

    def _prepare(self, req: Request) -> None:
        """A sequence's sampler row and asked-for prompt logprobs, or an embedding's pool."""
        if req.spec.embed is not None:
            req.pool = self.model.embedding().start(req.spec.embed)
            return
        config = req.spec.config
        req.sampler = BatchSampler(
            [config],
            [req.prompt],
            self.model.vocab_size,
            self.model.eos_token_ids,
            processors=self.model.processors,
            grammar=self.model.grammar() if config.constrained else None,
        )
        if self.spec is not None:
            check_speculable(req.sampler)
        if config.prompt_logprobs is not None:  # scored as its prompt is prefilled
            req.scorer = PromptScorer(req.prompt, config.prompt_logprobs)
        self.output.start(req.key, config, req.spec.prompt)

    def _prefilled(
        self, chunks: list[tuple[Request, int]], logits: torch.Tensor | None
    ) -> list[tuple[Request, torch.Tensor]]:
        """Count ``chunks`` as prefilled; the requests whose prompt completed, each with the
        logits of its last prompt token (embeddings that completed are answered here)."""
        if not chunks:
            return []
        done = [(chunks[i][0], logits[i]) for i in self.scheduler.advance(chunks)]
        self._out += [PromptLogprobs(r.key, r.scorer.entries) for r, _ in done if r.scorer]
        embedded = [req for req, _ in done if req.pool is not None]
        if embedded:
            self._embedded(embedded)
            done = [(req, lg) for req, lg in done if req.pool is None]
        return done

    def _join(self, requests: list[Request]) -> None:
        """Requests whose prefill completed join the running batch and its sampler."""
        for req in requests:
            if self.sampler is None:
                self.sampler = req.sampler
            else:
                self.sampler.add(req.sampler)
            req.sampler = None
        self.scheduler.join(requests)

    def _remove_rows(self, rows: list[int]) -> None:
        keep = self.scheduler.finish(rows)
        if self.spec is not None:
            self.spec.retain(keep)
        if not keep:
            self.sampler = None
        elif self.sampler is not None:
            self.sampler.select_rows(keep)

    def _emit(
        self,
        row: int,
        req: Request,
        token: int,
        eos: bool,
        length: bool,
        logprobs: LogprobEntry = (None, None, None),
        logits: torch.Tensor | None = None,
    ) -> bool:
        """Record running row ``row``'s token and queue its event; returns whether ``req``
        finished (EOS, ``max_new_tokens`` or the context window, or its grammar failed)."""
        req.last = token
        tokens = req.tokens
        tokens.append(token)
        reason = None
        if eos and (failure := self.sampler.grammar_failure(row)) is not None:  # EOS was forced
            self._invalid(req.key, failure)
            return True
        if eos:
            reason = "stop"
        elif length or (
            self.max_context is not None and req.prompt.numel() + len(tokens) >= self.max_context
        ):
            reason = "length"
        kept = logits if self.keep_logits else None
        self._out.append(Token(req.key, token, "", reason, *logprobs, kept))
        return reason is not None

    def _sample(
        self, decoded: torch.Tensor | None, ready: list[tuple[Request, torch.Tensor]]
    ) -> None:
        """Sample the running rows' next tokens (``decoded``) and the first tokens of the
        sequences whose prefill completed (they join the batch), emit, retire finished rows."""
        parts = [] if decoded is None else [decoded]
        if ready:
            self._join([r for r, _ in ready])
            parts.append(torch.stack([lg for _, lg in ready]))
        if not parts:
            return
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        result = self.sampler.step(logits)
        self.steps += 1
        tokens = result.tokens.tolist()
        eos = result.stopped_eos.tolist()
        length = result.stopped_length.tolist()
        running = self.scheduler.running
        entries = logprob_entries(
            result.logprobs, result.top_logprobs, [r.spec.config.logprobs for r in running]
        )
        finished = []
        for j, req in enumerate(running):
            if self._emit(j, req, tokens[j], eos[j], length[j], entries[j], logits[j]):
                finished.append(j)
        if finished:
            self._remove_rows(finished)

    def _spec_step(self, ready: list[tuple[Request, torch.Tensor]]) -> None:
        """Speculative decode of the running sequences plus the first token of ``ready``."""
        spec, running = self.spec, list(self.scheduler.running)
        seq_ids = [r.seq_id for r in running]
        drafted = None
        if running:
            contexts = [r.spec.prompt + r.tokens for r in running]
            generated = [len(r.tokens) for r in running]
            drafted = spec.draft(contexts, seq_ids, generated, self.sampler, self.cache)
        self._join([r for r, _ in ready])
        if not self.scheduler.running:
            return
        verdicts = spec.verify(self.sampler, drafted, [lg for _, lg in ready], seq_ids, self.cache)
        self.steps += 1
        delivered, finished = [], []
        for j, (req, verdict) in enumerate(zip(self.scheduler.running, verdicts)):
            tokens, done = self._emit_run(j, req, verdict)
            delivered.append(tokens)
            if done:
                finished.append(j)
        spec.commit(self.sampler, delivered)
        if finished:
            self._remove_rows(finished)

    def _emit_run(self, row: int, req: Request, verdict: RowVerdict) -> tuple[list[int], bool]:
        """Emit a row's verified tokens one at a time until it finishes (EOS, length: the rest
        of the run is dropped); returns the delivered tokens and whether the sequence
        finished. A ``SpecStep`` event for the step precedes the tokens."""
        cfg = self.sampler.configs[row]
        k = req.spec.config.logprobs
        lps = None if k is None else self.spec.logprobs(verdict.logits, verdict.tokens, k)
        at = len(self._out)
        delivered: list[int] = []
        done = False
        for t, token in enumerate(verdict.tokens):
            delivered.append(token)
            eos, length = stop_flags(cfg, token, len(req.tokens) + 1)
            logprobs = lps[t] if lps else (None, None, None)
            if self._emit(row, req, token, eos, length, logprobs, verdict.logits[t]):
                done = True
                break
        if verdict.speculative:
            event = SpecStep(req.key, verdict.proposed, verdict.accepted, len(delivered))
            self._out.insert(at, event)
        return delivered, done

    # -- failures and load ---------------------------------------------------------------------
    def _invalid(self, key: str, why: str, hint: str = "", error: Exception | None = None) -> None:
        """Sequence ``key`` asked for something wrong: served it fails (``invalid_request``);
        offline ``error`` raises, or a ``ConfigError`` naming the prompt, with ``hint``."""
        if self.offline:  # offline keys are prompt indices
            raise error or ConfigError(f"prompt {key}: {why}" + (f": {hint}" if hint else ""))
        self._out.append(SeqError(key, why, ErrorKind.INVALID_REQUEST))

    def _fail_active(self, message: str, kind: ErrorKind) -> None:
        """Fail every active sequence and start over on a fresh cache (served)."""
        own = self._own_cache
        cache = self.model.serving_cache(self.config.prefix_caching) if own else self.cache
        if self.spec is not None:
            self.spec.close()
        active = self.scheduler.clear(cache)
        self._out += [SeqError(req.key, message, kind) for req in active]
        self.sampler = None
        self.spec = self._new_spec()

    def _spill(self, final: bool = False) -> None:
        """Idle or stopping: the prefix cache's blocks not yet on disk go to its disk tier;
        ``final`` waits until they are written."""
        cache = self.cache
        if isinstance(cache, BlockCache) and cache.disk is not None:
            cache.disk.spill()
            if final:
                cache.disk.store.flush()

    def stats(self) -> Stats:
        s = self.scheduler
        return Stats(len(s.active), len(s.waiting), s.kv_used_fraction(), s.kv_booked_fraction())

    def _flush(self) -> None:
        stats = self.stats()
        if stats != self._last_stats:
            self._out.append(stats)
            self._last_stats = stats
        if not self._out:
            return
        out = self._take()
        try:
            self.emit(out)
        except Exception:  # the receiver is gone (shutdown); nothing else to tell
            log.debug("engine %s: emit failed", self.name, exc_info=True)
