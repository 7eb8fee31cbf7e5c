"""/metrics exposes the named Prometheus series, labelled by instance."""

from __future__ import annotations

import httpx

from .conftest import MODEL_NAME, client

SERIES = [
    "pace_time_to_first_token_seconds_bucket",
    "pace_inter_token_latency_seconds_bucket",
    "pace_e2e_request_latency_seconds_bucket",
    "pace_request_queue_time_seconds_bucket",
    "pace_prompt_tokens_total",
    "pace_generation_tokens_total",
    "pace_requests_finished_total",
    "pace_request_errors_total",
    "pace_num_requests_running",
    "pace_num_requests_waiting",
    "pace_kv_cache_usage_ratio",
]


def _value(text: str, prefix: str) -> float:
    for line in text.splitlines():
        if line.startswith(prefix):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{prefix} not found")


def test_metrics_after_requests(server):
    before = httpx.get(server.url + "/metrics").text
    gen_before = _value(before, 'pace_generation_tokens_total{instance="0"}')
    out = client(server).completions.create(
        model=MODEL_NAME,
        prompt="Hello there",
        max_tokens=5,
        temperature=0,
        extra_body={"ignore_eos": True},
    )
    assert out.usage.completion_tokens == 5
    httpx.post(server.url + "/v1/completions", json={"prompt": "x", "temperature": 9})
    r = httpx.get(server.url + "/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    text = r.text
    for name in SERIES:
        assert name in text, name
    assert _value(text, 'pace_generation_tokens_total{instance="0"}') == gen_before + 5
    assert _value(text, 'pace_requests_finished_total{finish_reason="length",instance="0"}') >= 1
    assert _value(text, 'pace_time_to_first_token_seconds_count{instance="0"}') >= 1
    assert (
        _value(text, 'pace_request_errors_total{instance="frontend",type="invalid_request_error"}')
        >= 1
    )
    assert 0.0 <= _value(text, 'pace_kv_cache_usage_ratio{instance="0"}') <= 1.0
