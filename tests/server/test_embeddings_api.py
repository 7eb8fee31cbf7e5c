"""POST /v1/embeddings against a live server (real SmolLM2, fp32): the OpenAI shape, the same
vectors as ``LLMModel.embed`` (checked against transformers in tests/engine/test_embed.py),
sharing the engine with generation, and 4xx for what cannot run."""

from __future__ import annotations

import base64
import pickle
import threading

import httpx
import numpy as np
import pytest
import torch

from pace_core.engine.events import Embedding

from .conftest import MODEL_NAME, client, wait_idle

TEXTS = ["The cat sat on the mat.", "Embeddings on CPUs", "x"]
LONG = " ".join(f"word{i}" for i in range(90))  # > 64 tokens: prefilled in chunks here


def post(http, body):
    return httpx.post(f"{http.url}/v1/embeddings", json=body, timeout=60)


def test_vectors_match_offline_and_come_back_in_order(server, llm):
    r = post(server, {"model": MODEL_NAME, "input": [*TEXTS, LONG], "encoding_format": "float"})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["object"] == "list" and body["model"] == MODEL_NAME
    assert [d["index"] for d in body["data"]] == [0, 1, 2, 3]
    assert {d["object"] for d in body["data"]} == {"embedding"}
    got = torch.tensor([d["embedding"] for d in body["data"]])
    want = llm.embed([*TEXTS, LONG])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    tokens = sum(len(llm.tokenizer(t)["input_ids"]) for t in [*TEXTS, LONG])
    assert body["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}
    wait_idle(server)


def test_openai_client_base64_and_token_inputs(server, llm):
    """The openai client asks for base64 by default and decodes it; token-id inputs embed
    the same as their text."""
    oai = client(server)
    res = oai.embeddings.create(model=MODEL_NAME, input=TEXTS[0])
    vec = torch.tensor(res.data[0].embedding)
    ids = llm.tokenizer(TEXTS[0])["input_ids"]
    by_ids = oai.embeddings.create(model=MODEL_NAME, input=ids, encoding_format="float")
    both = oai.embeddings.create(model=MODEL_NAME, input=[ids, ids[:3]], encoding_format="float")
    want = llm.embed([ids, ids[:3]])
    torch.testing.assert_close(vec, want[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(torch.tensor(by_ids.data[0].embedding), want[0], atol=1e-5, rtol=0)
    torch.testing.assert_close(
        torch.tensor([d.embedding for d in both.data]), want, atol=1e-5, rtol=0
    )
    raw = post(server, {"input": TEXTS[0], "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
    torch.testing.assert_close(torch.from_numpy(decoded.copy()), want[0], atol=1e-5, rtol=0)


def test_embeddings_share_the_engine_with_a_streaming_generation(server, llm):
    """Embedding requests while a chat streams: both answer, the chat's tokens equal a run
    without the embeddings, and the engine ends idle with every KV block free."""
    oai = client(server)
    ask = {"model": MODEL_NAME, "messages": [{"role": "user", "content": "Count to ten."}],
           "max_tokens": 24, "temperature": 0}  # fmt: skip
    alone = oai.chat.completions.create(**ask).choices[0].message.content
    streamed: list[str] = []

    def chat():
        for chunk in oai.chat.completions.create(**ask, stream=True):
            if chunk.choices and chunk.choices[0].delta.content:
                streamed.append(chunk.choices[0].delta.content)

    t = threading.Thread(target=chat)
    t.start()
    answers = [post(server, {"input": [LONG, t]}) for t in TEXTS]
    t.join(60)
    assert [a.status_code for a in answers] == [200, 200, 200]
    assert "".join(streamed) == alone
    want = llm.embed([LONG, TEXTS[1]])
    torch.testing.assert_close(
        torch.tensor([d["embedding"] for d in answers[1].json()["data"]]), want, atol=1e-5, rtol=0
    )
    wait_idle(server)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["ok", ""]}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": 5}, "input"),
        ({"input": [1, 10**7]}, "input"),
        ({"input": ["a"] * 2049}, "input"),
        ({"input": "hi", "dimensions": 64}, "dimensions"),
        ({"input": "hi", "dimensions": 0}, "dimensions"),
        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "hi", "pooling": "mean"}, "pooling"),
        ({"input": LONG * 40}, "input"),
    ],
    ids=[
        "empty-text", "empty-list", "empty-item", "empty-ids", "number", "outside-vocab",
        "too-many", "dimensions-not-matryoshka", "dimensions-zero", "encoding", "unknown-field",
        "too-long",
    ],
)  # fmt: skip
def test_bad_requests_are_400_naming_the_field(server, body, param):
    r = post(server, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["param"] == param, err
    assert err["message"]


def test_unknown_model_is_404_and_the_route_is_documented(server):
    r = post(server, {"model": "nope", "input": "hi"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    schema = httpx.get(f"{server.url}/openapi.json").json()
    assert "/v1/embeddings" in schema["paths"]
    assert "EmbeddingRequest" in schema["components"]["schemas"]


def test_embedding_events_cross_a_pipe():
    ev = Embedding("k:0", torch.randn(8), 5)
    got = pickle.loads(pickle.dumps(ev))
    assert (got.key, got.prompt_tokens) == ("k:0", 5) and torch.equal(got.vector, ev.vector)


def test_a_client_that_gives_up_is_no_server_error(server):
    """The client leaves before its vectors come: the request is cancelled quietly (was a
    KeyError logged as an unhandled error and counted as an internal_error)."""

    def internal_errors() -> float:
        text = httpx.get(f"{server.url}/metrics").text
        lines = [ln for ln in text.splitlines() if 'type="internal_error"' in ln]
        return sum(float(ln.rsplit(" ", 1)[1]) for ln in lines if not ln.startswith("#"))

    before = internal_errors()
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{server.url}/v1/embeddings", json={"input": [[5] * 2000]}, timeout=0.2)
    wait_idle(server)
    assert internal_errors() == before
