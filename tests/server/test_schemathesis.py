"""Property-based fuzzing of the app's own OpenAPI schema: no input may produce a 5xx."""

from __future__ import annotations

import httpx
import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402

from .conftest import serve  # noqa: E402

OPERATIONS = [("/v1/completions", "POST"), ("/v1/chat/completions", "POST"), ("/v1/models", "GET")]
EXAMPLES = {"positive": 15, "negative": 15}  # per POST operation and mode


def test_fuzz_no_server_errors(llm):
    # A short timeout bounds the valid-but-long generations the fuzzer asks for.
    with serve(llm, request_timeout=1.0, engine={"max_queue": 4}) as http:
        raw = httpx.get(http.url + "/openapi.json").json()
        schema = schemathesis.openapi.from_dict(raw)
        failures = []
        for path, method in OPERATIONS:
            op = schema[path][method]
            for mode, count in EXAMPLES.items():
                if method == "GET" and mode == "negative":
                    continue  # no parameters: nothing to make invalid
                strategy = op.as_strategy(generation_mode=schemathesis.GenerationMode(mode))

                @settings(
                    max_examples=count if method == "POST" else 5,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                    derandomize=True,
                )
                @given(case=strategy)
                def run(case):
                    response = case.call(base_url=http.url, timeout=30)
                    if response.status_code >= 500:
                        failures.append((case.path, case.body, response.text[:300]))
                    elif response.status_code != 200:
                        assert set(response.json()["error"]) >= {"message", "type", "code"}

                run()
        assert not failures, failures
