"""The serving engine: iteration-level continuous batching over a block KV cache.

One :class:`EngineCore` owns one model and one block cache (PAGED or SLAB_POOL) and runs a
loop in a dedicated thread. Each iteration:

1. drains its inbox (new sequences, cancellations; blocks on the inbox when idle);
2. admits waiting sequences in FIFO order while fewer than ``max_running`` are active and the
   KV *booking* fits (see below);
3. takes prompt chunks, FIFO from admitted sequences, up to the iteration's
   :class:`~pace_core.server.prefill_budget.PrefillBudget`: ``max_prefill_tokens`` when
   nothing decodes, else about ``prefill_slice_ms`` of prefill work; a long prompt is split
   into chunks over several iterations (``forward_step`` with ``num_new`` < prompt length), so
   a running decode waits for at most one short chunk per token;
4. runs ONE forward: every running sequence's next token and the prompt chunks together when
   the model's decoder stack packs ragged steps (``DecoderLM.packs_ragged_steps``: no padding
   computed, the weights read once per iteration), else the chunks (grouped by length) and
   then one batched decode forward;
5. samples with one :class:`BatchSampler` whose rows follow the running sequences (rows of
   sequences whose prefill just completed join with ``add``; finished or cancelled rows leave
   with ``select_rows``), detokenizes, and emits events;
6. frees the KV blocks of finished sequences at once.

With a model loaded with ``spec_config``, steps 4-5 are speculative
(:class:`~pace_core.server.speculative.SpecDecoder`): drafts for every running sequence, one
target forward over ``[last, drafts]`` per row, verification, KV rollback; a sequence may then
emit several tokens per iteration.

Admission policy ("full booking"): a sequence books ``ceil((prompt + max_tokens) / block)``
blocks when admitted and keeps the booking until it finishes; it is admitted only when the sum
of bookings stays within the pool. A running sequence never needs more blocks than it booked,
so a decode step can never hit :class:`CacheFullError` and nothing is ever preempted; the
price is that capacity is reserved for tokens that an early EOS never uses. Requests whose
booking exceeds the whole pool are rejected (400) by the front door.

Commands arrive on the inbox and events go to ``emit`` (a list per iteration) as the
dataclasses of :mod:`pace_core.server.events`: :class:`Admitted`, :class:`Token`,
:class:`SpecStep` (one verification step of a sequence, sent before that step's tokens),
:class:`SeqError` and :class:`Stats`.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from pace_core.engine.generate import forward_step
from pace_core.engine.sequence import SequenceTracker
from pace_core.models import heap
from pace_core.sampling.sampler import BatchSampler
from pace_core.server.engine_config import EngineConfig, context_window, engine_cache
from pace_core.server.events import (
    Admitted,
    Cancel,
    Command,
    Event,
    SeqError,
    SeqSpec,
    SpecStep,
    Stats,
    Stop,
    Submit,
    Token,
)
from pace_core.server.prefill_budget import PrefillBudget
from pace_core.server.speculative import RowVerdict, SpecDecoder
from pace_core.server.step_rows import group_chunks, plan_chunks, step_batch
from pace_core.server.warm_up import warm_up
from pace_core.speculative.verify import check_speculable, stop_flags

log = logging.getLogger("pace.server.engine")

Emit = Callable[[list[Event]], None]


class _Seq:
    __slots__ = ("booked", "done", "last", "prompt", "sampler", "seq_id", "spec", "tracker")

    def __init__(self, spec: SeqSpec) -> None:
        self.spec = spec
        self.prompt = torch.tensor(spec.prompt, dtype=torch.long)
        self.seq_id = -1
        self.booked = 0
        self.done = 0  # prompt tokens prefilled so far
        self.last = -1  # last sampled token (the next decode input)
        self.tracker: SequenceTracker | None = None
        self.sampler: BatchSampler | None = None  # its row, until it joins the batch


class EngineCore:
    """The scheduler and model loop of one instance; :meth:`run` is the thread body."""

    def __init__(self, llm: Any, config: EngineConfig, emit: Emit, name: str = "0") -> None:
        self.llm = llm
        self.config = config
        self.emit = emit
        self.name = name
        self.cache = engine_cache(llm, config)
        self.block_size = int(self.cache.block_size)
        self.num_blocks = int(self.cache.num_blocks)
        self.max_context = context_window(llm)
        self.spec = self._new_spec()
        self.processors = llm.host.samplers.values()
        self.inbox: queue.Queue = queue.Queue()
        self.waiting: collections.deque[_Seq] = collections.deque()
        self.prefilling: list[_Seq] = []
        self.running: list[_Seq] = []
        self.sampler: BatchSampler | None = None
        self.prefill_budget = PrefillBudget(config.max_prefill_tokens, config.prefill_slice_ms)
        # one forward per iteration for decodes and prompt chunks (speculative steps keep theirs)
        self.mixed = (
            config.mixed_steps
            and self.spec is None
            and bool(getattr(llm.model, "packs_ragged_steps", False))
        )
        self.booked = 0
        self.steps = 0
        self._out: list[Event] = []
        self._stopped = False
        self.warmed = threading.Event()  # set by run once warmed up (or its warm-up failed)
        self._last_stats: Stats | None = None

    # -- thread-safe entry points --------------------------------------------------------
    def submit(self, specs: list[SeqSpec]) -> None:
        self.inbox.put(Submit(specs))

    def cancel(self, keys: list[str]) -> None:
        self.inbox.put(Cancel(keys))

    def stop(self) -> None:
        self.inbox.put(Stop())

    def _new_spec(self) -> SpecDecoder | None:
        if getattr(self.llm, "speculator", None) is None:
            return None
        return SpecDecoder(self.llm, self.cache, self.max_context)

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def kv_used_blocks(self) -> int:
        return self.num_blocks - self.cache.num_free_blocks

    # -- the loop --------------------------------------------------------------------------
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
        self._fail_active("server is shutting down", status=503)
        for seq in self.waiting:
            self._out.append(SeqError(seq.spec.key, "server is shutting down", "unavailable", 503))
        self.waiting.clear()
        self._flush()

    def warm_up(self) -> float | None:
        """Before serving: the pool committed and the prefill rate measured
        (:func:`~pace_core.server.warm_up.warm_up`); returns the rate or None."""
        return warm_up(self.llm.model, self.cache, self.prefill_budget, self.max_context, self.name)

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.prefilling or self.running)

    def run_once(self, block: bool = False) -> bool:
        """One scheduler iteration; with ``block``, first wait for work when idle.
        Returns whether a step ran."""
        if not self.busy:
            self._flush()
        self._drain(block=block and not self.busy)
        if self._stopped or not self.busy:
            self._flush()  # e.g. rejections made while draining
            return False
        with torch.inference_mode():
            try:
                self._admit()
                self._step()
            except Exception as exc:  # keep serving: fail what was in flight, reset
                log.exception("engine %s: step failed", self.name)
                self._fail_active(f"engine step failed: {type(exc).__name__}: {exc}")
        self._flush()
        return True

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
                need = self.blocks_for(spec.reserve_tokens)
                if need > self.num_blocks:
                    self._out.append(
                        SeqError(
                            spec.key,
                            f"the request needs {spec.reserve_tokens} tokens of KV cache "
                            f"(prompt + max_tokens); this server holds {self.capacity_tokens}",
                            "invalid_request_error",
                            400,
                        )
                    )
                else:
                    self.waiting.append(_Seq(spec))
        elif isinstance(command, Cancel):
            self._cancel(set(command.keys))
        elif isinstance(command, Stop):
            self._stopped = True

    def _cancel(self, keys: set[str]) -> None:
        if any(s.spec.key in keys for s in self.waiting):
            self.waiting = collections.deque(s for s in self.waiting if s.spec.key not in keys)
        for seq in [s for s in self.prefilling if s.spec.key in keys]:
            self.prefilling.remove(seq)
            self._release(seq)
        rows = [j for j, s in enumerate(self.running) if s.spec.key in keys]
        if rows:
            self._remove_rows(rows)

    def _release(self, seq: _Seq) -> None:
        self.cache.free_sequence(seq.seq_id)
        self.booked -= seq.booked
        seq.booked = 0

    def _remove_rows(self, rows: list[int]) -> None:
        gone = set(rows)
        for j in rows:
            self._release(self.running[j])
        keep = [j for j in range(len(self.running)) if j not in gone]
        self.running = [self.running[j] for j in keep]
        if self.spec is not None:
            self.spec.retain(keep)
        if not keep:
            self.sampler = None
        elif self.sampler is not None:
            self.sampler.select_rows(keep)

    def _admit(self) -> None:
        now = time.monotonic()
        while self.waiting and len(self.prefilling) + len(self.running) < self.config.max_running:
            seq = self.waiting[0]
            need = self.blocks_for(seq.spec.reserve_tokens)
            if self.booked + need > self.num_blocks:
                break
            self.waiting.popleft()
            try:  # per-request problems surface here, not in the shared batch
                seq.sampler = BatchSampler(
                    [seq.spec.config],
                    [seq.prompt],
                    self.llm.model.vocab_size,
                    self.llm.eos_token_ids,
                    processors=self.processors,
                    grammar=self.llm.grammar if seq.spec.config.constrained else None,
                )
                if self.spec is not None:
                    check_speculable(seq.sampler)
            except (ValueError, TypeError, NotImplementedError) as exc:
                msg = f"invalid sampling parameters: {exc}"
                self._out.append(SeqError(seq.spec.key, msg, "invalid_request_error", 400))
                continue
            seq.booked = need
            self.booked += need
            (seq.seq_id,) = self.cache.add_sequences(1)
            seq.done = self.cache.adopt_prefix(seq.seq_id, seq.spec.prompt, seq.spec.cache_salt)
            seq.tracker = SequenceTracker(
                seq.spec.config, len(seq.spec.prompt), self.llm.tokenizer, self.max_context
            )
            self.prefilling.append(seq)
            wait = max(0.0, now - seq.spec.arrival)
            self._out.append(Admitted(seq.spec.key, wait, len(seq.spec.prompt), seq.done))

    def _chunks(self) -> list[tuple[_Seq, int]]:
        """This iteration's prompt chunks ``(seq, tokens)``, FIFO within the prefill budget."""
        budget = self.prefill_budget.tokens(decoding=bool(self.running))
        return plan_chunks([(s, s.prompt.numel() - s.done) for s in self.prefilling], budget)

    def _advance(
        self, chunks: list[tuple[_Seq, int]], logits: torch.Tensor
    ) -> list[tuple[_Seq, torch.Tensor]]:
        """Count the chunks as prefilled; returns the sequences whose prompt is complete with
        the logits of their last prompt token (``logits`` has a row per chunk)."""
        ready = []
        for b, (seq, n) in enumerate(chunks):
            seq.done += n
            if seq.done == seq.prompt.numel():
                ready.append((seq, logits[b]))
        return ready

    def _forward(self, decodes: list[_Seq], chunks: list[tuple[_Seq, int]]) -> torch.Tensor:
        """One forward: the next token of each of ``decodes``, then each prompt chunk; logits
        of every row's last token."""
        pieces = [seq.prompt[seq.done : seq.done + n] for seq, n in chunks]
        batch, counts = step_batch([seq.last for seq in decodes], pieces)
        seq_ids = [seq.seq_id for seq in decodes] + [seq.seq_id for seq, _ in chunks]
        return forward_step(self.llm.model, self.cache, seq_ids, batch, counts)

    def _prefill(self, chunks: list[tuple[_Seq, int]]) -> list[tuple[_Seq, torch.Tensor]]:
        """Run prompt chunks as forwards of their own (grouped by length)."""
        ready = []
        for group in group_chunks(chunks):
            start = time.perf_counter()
            logits = self._forward([], group)
            self.prefill_budget.record(sum(n for _, n in group), time.perf_counter() - start)
            ready += self._advance(group, logits)
        return ready

    def _mixed_forward(
        self, chunks: list[tuple[_Seq, int]]
    ) -> tuple[torch.Tensor | None, list[tuple[_Seq, torch.Tensor]]]:
        """The running sequences' next tokens and the prompt chunks in one packed forward:
        (decode logits or None, sequences whose prompt completed)."""
        decodes = len(self.running)
        start = time.perf_counter()
        logits = self._forward(self.running, chunks)
        if chunks:
            prompt_tokens = sum(n for _, n in chunks)
            self.prefill_budget.record(prompt_tokens, time.perf_counter() - start, decodes)
        ready = self._advance(chunks, logits[decodes:])
        return (logits[:decodes] if decodes else None), ready

    def _join(self, seqs: list[_Seq]) -> None:
        """Sequences whose prefill completed join the running batch and its sampler."""
        for s in seqs:
            if self.sampler is None:
                self.sampler = s.sampler
            else:
                self.sampler.add(s.sampler)
            s.sampler = None
            self.prefilling.remove(s)
        self.running.extend(seqs)

    def _emit(
        self,
        seq: _Seq,
        token: int,
        eos: bool,
        length: bool,
        logprobs: tuple[Any, Any, Any] = (None, None, None),
    ) -> bool:
        """Record one generated token and queue its event; returns whether ``seq`` finished."""
        seq.last = token
        delta = seq.tracker.add(token, eos, length)
        reason = seq.tracker.finish_reason
        self._out.append(Token(seq.spec.key, token, delta, reason, *logprobs))
        return reason is not None

    def _step(self) -> None:
        chunks = self._chunks() if self.prefilling else []
        if self.mixed:
            if not (chunks or self.running):
                return  # only waiting sequences, none admitted yet
            decoded, ready = self._mixed_forward(chunks)
            self._sample(decoded, ready)
            return
        ready = self._prefill(chunks)
        if self.spec is not None:
            self._spec_step(ready)
            return
        decoded = self._forward(self.running, []) if self.running else None
        self._sample(decoded, ready)

    def _sample(
        self, decoded: torch.Tensor | None, ready: list[tuple[_Seq, torch.Tensor]]
    ) -> None:
        """Sample the running rows' next tokens (``decoded``) and the first tokens of the
        sequences whose prefill completed (they join the batch), emit, retire finished rows."""
        parts = [] if decoded is None else [decoded]
        if ready:
            self._join([s for s, _ in ready])
            parts.append(torch.stack([lg for _, lg in ready]))
        if not parts:
            return
        logits = parts[0] if len(parts) == 1 else torch.cat(parts)
        result = self.sampler.step(logits)
        self.steps += 1
        tokens = result.tokens.tolist()
        eos = result.stopped_eos.tolist()
        length = result.stopped_length.tolist()
        lps = result.logprobs.tolist() if result.logprobs is not None else None
        top_ids = top_vals = None
        if result.top_logprobs is not None:
            top_ids, top_vals = (t.tolist() for t in result.top_logprobs)
        finished = []
        for j, seq in enumerate(self.running):
            k = seq.spec.config.logprobs
            lp = ids_j = vals_j = None
            if k is not None and lps is not None:
                lp = lps[j]
                if k and top_ids is not None:
                    ids_j, vals_j = top_ids[j][:k], top_vals[j][:k]
            if self._emit(seq, tokens[j], eos[j], length[j], (lp, ids_j, vals_j)):
                finished.append(j)
        if finished:
            self._remove_rows(finished)

    def _spec_step(self, ready: list[tuple[_Seq, torch.Tensor]]) -> None:
        """Speculative decode of the running sequences plus the first token of ``ready``."""
        spec, running = self.spec, list(self.running)
        seq_ids = [s.seq_id for s in running]
        drafted = None
        if running:
            contexts = [s.spec.prompt + s.tracker.tokens for s in running]
            generated = [len(s.tracker.tokens) for s in running]
            drafted = spec.draft(contexts, seq_ids, generated, self.sampler, self.cache)
        self._join([s for s, _ in ready])
        if not self.running:
            return
        verdicts = spec.verify(self.sampler, drafted, [lg for _, lg in ready], seq_ids, self.cache)
        self.steps += 1
        delivered, finished = [], []
        for j, (seq, verdict) in enumerate(zip(self.running, verdicts)):
            tokens, done = self._emit_run(j, seq, verdict)
            delivered.append(tokens)
            if done:
                finished.append(j)
        spec.commit(self.sampler, delivered)
        if finished:
            self._remove_rows(finished)

    def _emit_run(self, row: int, seq: _Seq, verdict: RowVerdict) -> tuple[list[int], bool]:
        """Emit a row's verified tokens one at a time until it finishes (EOS, stop string,
        length: the rest of the run is dropped); returns the delivered tokens and whether the
        sequence finished. A ``spec`` event for the step precedes the tokens."""
        cfg = self.sampler.configs[row]
        k = seq.spec.config.logprobs
        lps = None if k is None else self.spec.logprobs(verdict.logits, verdict.tokens, k)
        at = len(self._out)
        delivered: list[int] = []
        done = False
        for t, token in enumerate(verdict.tokens):
            delivered.append(token)
            eos, length = stop_flags(cfg, token, len(seq.tracker.tokens) + 1)
            if self._emit(seq, token, eos, length, lps[t] if lps else (None, None, None)):
                done = True
                break
        if verdict.speculative:
            event = SpecStep(seq.spec.key, verdict.proposed, verdict.accepted, len(delivered))
            self._out.insert(at, event)
        return delivered, done

    def _fail_active(self, message: str, status: int = 503) -> None:
        for seq in self.prefilling + self.running:
            self._out.append(SeqError(seq.spec.key, message, "engine_error", status))
        self.prefilling, self.running, self.sampler = [], [], None
        self.booked = 0
        if self.spec is not None:
            self.spec.close()
        self.cache = engine_cache(self.llm, self.config)
        self.spec = self._new_spec()

    def stats(self) -> Stats:
        nb = self.num_blocks
        return Stats(
            len(self.running) + len(self.prefilling),
            len(self.waiting),
            self.kv_used_blocks() / nb,
            self.booked / nb,
        )

    def _flush(self) -> None:
        stats = self.stats()
        if stats != self._last_stats:
            self._out.append(stats)
            self._last_stats = stats
        if not self._out:
            return
        out, self._out = self._out, []
        try:
            self.emit(out)
        except Exception:  # the receiver is gone (shutdown); nothing else to tell
            log.debug("engine %s: emit failed", self.name, exc_info=True)
