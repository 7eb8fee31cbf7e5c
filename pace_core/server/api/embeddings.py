"""``POST /v1/embeddings``: inputs -> engine sequences that embed -> the OpenAI list shape.

Texts are tokenized on the server's text thread (the model's sentence-transformers default
prompt prepended, as sentence-transformers does); each input becomes one
:class:`~pace_core.engine.events.SeqSpec` with an
:class:`~pace_core.engine.events.EmbedSpec`, routed like any request, so embeddings and
generation share the engines' steps and their prefill budget.
"""

from __future__ import annotations

import base64
import uuid
from dataclasses import dataclass
from typing import Any

from pace_core.engine.events import EmbedSpec, SeqSpec
from pace_core.errors import ConfigError
from pace_core.sampling.config import SamplingConfig
from pace_core.server.api.openai_request import check_model, check_vocab, encode
from pace_core.server.api.protocol import APIError, EmbeddingRequest
from pace_core.server.frontdoor.context import ServingContext
from pace_core.server.frontdoor.frontend import Submission


@dataclass
class EmbeddingPlan:
    """The token ids of each input and how they are embedded."""

    prompts: list[list[int]]
    spec: EmbedSpec


def embedding_plan(server: ServingContext, req: EmbeddingRequest) -> EmbeddingPlan:
    """Check and tokenize a request (400/404 :class:`APIError` for what cannot run)."""
    check_model(server, req.model)
    rules = server.embedding
    if isinstance(rules, str):
        raise APIError(400, f"this model cannot serve embeddings: {rules}", param="model")
    try:
        rules.check_dimensions(req.dimensions)
    except ConfigError as exc:
        raise APIError(400, str(exc), param="dimensions") from None
    prompts = [encode(server, rules.prompt + x) if isinstance(x, str) else x for x in req.input]
    room = min(server.max_context, server.frontend.capacity_tokens() or server.max_context)
    for i, ids in enumerate(prompts):
        check_vocab(server, ids, f"input[{i}] has token id", "input")
        if len(ids) > room:
            raise APIError(
                400,
                f"input[{i}] has {len(ids)} tokens; this server embeds at most {room} per "
                "input (its context window and KV pool); split the text",
                param="input",
                code="context_length_exceeded",
            )
    return EmbeddingPlan(prompts, EmbedSpec(dimensions=req.dimensions))


def embedding_body(
    server: ServingContext, plan: EmbeddingPlan, vectors: list[Any], encoding: str
) -> dict[str, Any]:
    """The OpenAI response: one ``embedding`` object per input, in order, and the usage."""
    data = []
    for i, vector in enumerate(vectors):
        if encoding == "base64":  # little-endian float32, as OpenAI's clients decode it
            value: Any = base64.b64encode(vector.numpy().astype("<f4").tobytes()).decode()
        else:
            value = vector.tolist()
        data.append({"object": "embedding", "index": i, "embedding": value})
    tokens = sum(len(p) for p in plan.prompts)
    return {
        "object": "list",
        "data": data,
        "model": server.config.served_model_name,
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    }


def submit(server: ServingContext, plan: EmbeddingPlan) -> tuple[list[str], Submission]:
    """One embedding sequence per input, routed to one instance (429/503 when none fits);
    returns their keys in input order and the submission."""
    rid = uuid.uuid4().hex[:16]
    config = SamplingConfig()
    specs = [
        SeqSpec(f"{rid}:{i}", prompt, config, embed=plan.spec)
        for i, prompt in enumerate(plan.prompts)
    ]
    sub = server.frontend.submit(rid, specs, sum(len(p) for p in plan.prompts))
    return [spec.key for spec in specs], sub
