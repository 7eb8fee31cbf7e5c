"""Prometheus metrics of one server (its own registry, so apps never share series)."""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

_LATENCY = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)
_ACCEPTED = (0, 1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32)
_ITL = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0)

CONTENT_TYPE = CONTENT_TYPE_LATEST


@dataclass(frozen=True)
class TokenSeries:
    """One instance's series touched for every generated token or engine step, bound once (a
    ``labels()`` lookup costs more than the update)."""

    generation_tokens: Counter
    ttft: Histogram
    itl: Histogram
    e2e: Histogram
    running: Gauge
    waiting: Gauge
    kv_usage: Gauge
    kv_booked: Gauge


class Metrics:
    """All series carry an ``instance`` label (``frontend`` for errors before routing).

    ``speculative``: the engines decode speculatively; their ``pace_spec_decode_*`` series are
    created at zero with each instance (they exist, empty, in any case).
    """

    def __init__(self, speculative: bool = False) -> None:
        self.speculative = speculative
        r = self.registry = CollectorRegistry()
        inst = ["instance"]
        self.ttft = Histogram(
            "pace_time_to_first_token_seconds",
            "Time from request arrival to its first generated token.",
            inst,
            buckets=_LATENCY,
            registry=r,
        )
        self.itl = Histogram(
            "pace_inter_token_latency_seconds",
            "Time between consecutive tokens of one sequence.",
            inst,
            buckets=_ITL,
            registry=r,
        )
        self.e2e = Histogram(
            "pace_e2e_request_latency_seconds",
            "Time from request arrival to its last token.",
            inst,
            buckets=_LATENCY,
            registry=r,
        )
        self.queue_time = Histogram(
            "pace_request_queue_time_seconds",
            "Time a sequence waited before the engine admitted it.",
            inst,
            buckets=_LATENCY,
            registry=r,
        )
        self.prompt_tokens = Counter(
            "pace_prompt_tokens", "Prompt tokens of admitted sequences.", inst, registry=r
        )
        self.generation_tokens = Counter(
            "pace_generation_tokens", "Generated tokens.", inst, registry=r
        )
        self.prefix_queries = Counter(
            "pace_prefix_cache_queries",
            "Prompt tokens of admitted sequences looked up in the prefix cache.",
            inst,
            registry=r,
        )
        self.prefix_hits = Counter(
            "pace_prefix_cache_hits",
            "Prompt tokens whose KV came from the prefix cache.",
            inst,
            registry=r,
        )
        self.requests = Counter(
            "pace_requests_finished",
            "Finished sequences (one per choice) by finish reason.",
            [*inst, "finish_reason"],
            registry=r,
        )
        self.errors = Counter(
            "pace_request_errors",
            "Requests answered with an error, by type.",
            [*inst, "type"],
            registry=r,
        )
        self.running = Gauge(
            "pace_num_requests_running", "Sequences in prefill or decode.", inst, registry=r
        )
        self.waiting = Gauge(
            "pace_num_requests_waiting", "Sequences queued for admission.", inst, registry=r
        )
        self.kv_usage = Gauge(
            "pace_kv_cache_usage_ratio", "Fraction of KV cache blocks in use.", inst, registry=r
        )
        self.kv_booked = Gauge(
            "pace_kv_cache_booked_ratio",
            "Fraction of KV cache blocks booked by admitted sequences (prompt + max_tokens).",
            inst,
            registry=r,
        )

        self.spec_draft_tokens = Counter(
            "pace_spec_decode_draft_tokens",
            "Draft tokens proposed to the target for verification.",
            inst,
            registry=r,
        )
        self.spec_accepted_tokens = Counter(
            "pace_spec_decode_accepted_tokens",
            "Draft tokens the target accepted.",
            inst,
            registry=r,
        )
        self.spec_draft_per_position = Counter(
            "pace_spec_decode_draft_tokens_per_position",
            "Draft tokens proposed at each draft position (0 = first draft of a step).",
            [*inst, "position"],
            registry=r,
        )
        self.spec_accepted_per_position = Counter(
            "pace_spec_decode_accepted_tokens_per_position",
            "Draft tokens accepted at each draft position; / draft_tokens_per_position = the "
            "acceptance rate per position.",
            [*inst, "position"],
            registry=r,
        )
        self.spec_accepted_length = Histogram(
            "pace_spec_decode_accepted_length",
            "Accepted draft tokens per verification step that had a draft (its mean is the "
            "mean accepted length).",
            inst,
            buckets=_ACCEPTED,
            registry=r,
        )

    def init_instance(self, name: str) -> TokenSeries:
        """Create the instance's series at zero so they are visible before any traffic;
        returns its per-token ones."""
        for metric in (self.ttft, self.itl, self.e2e, self.queue_time, self.prompt_tokens):
            metric.labels(name)
        for metric in (self.generation_tokens, self.running, self.waiting, self.kv_usage):
            metric.labels(name)
        for metric in (self.kv_booked, self.prefix_queries, self.prefix_hits):
            metric.labels(name)
        if self.speculative:
            for metric in (
                self.spec_draft_tokens,
                self.spec_accepted_tokens,
                self.spec_accepted_length,
            ):
                metric.labels(name)
        return TokenSeries(
            self.generation_tokens.labels(name),
            self.ttft.labels(name),
            self.itl.labels(name),
            self.e2e.labels(name),
            self.running.labels(name),
            self.waiting.labels(name),
            self.kv_usage.labels(name),
            self.kv_booked.labels(name),
        )

    def record_spec_step(self, name: str, proposed: int, accepted: int) -> None:
        """One verification step of one sequence on instance ``name``."""
        if not proposed:
            return
        self.spec_draft_tokens.labels(name).inc(proposed)
        self.spec_accepted_tokens.labels(name).inc(accepted)
        for j in range(proposed):
            self.spec_draft_per_position.labels(name, str(j)).inc()
        for j in range(accepted):
            self.spec_accepted_per_position.labels(name, str(j)).inc()
        self.spec_accepted_length.labels(name).observe(accepted)

    def render(self) -> bytes:
        return generate_latest(self.registry)
