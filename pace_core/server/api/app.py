"""The OpenAI-compatible HTTP front door (FastAPI): routes, auth, errors, OpenAPI.

``create_app(server)`` builds the app for a :class:`~pace_core.server.frontdoor.server.Server`. The
routes stay small: the request is translated by :mod:`~pace_core.server.api.openai_request`,
submitted to the :class:`~pace_core.server.frontdoor.frontend.Frontend`, and answered by
:mod:`~pace_core.server.api.delivery` in the shapes of :mod:`~pace_core.server.api.openai_response`.
The ``/v1`` routes require the API key (:func:`require_api_key`, a FastAPI dependency) and
read their body under the size limit (:func:`request_body`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from pace_core.server.api import embeddings as emb
from pace_core.server.api import openai_request as oreq
from pace_core.server.api.delivery import embeddings, respond
from pace_core.server.api.openai_response import ChatFormat, CompletionFormat
from pace_core.server.api.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    DetokenizeRequest,
    EmbeddingRequest,
    TokenizeRequest,
    error_body,
    parse,
)
from pace_core.server.api.tokenize_api import detokenize, model_card, tokenize
from pace_core.server.frontdoor.metrics import CONTENT_TYPE
from pace_core.server.frontdoor.server import Server, ServerConfig
from pace_core.server.ui import router as chat_page

T = TypeVar("T")
log = logging.getLogger("pace.server")

WARM_UP_TIMEOUT_S = 600.0
"""How long the server waits for its engines' warm-up before it listens anyway."""


def _server(request: Request) -> Server:
    return request.app.state.server


# -- dependencies ------------------------------------------------------------------------------
async def require_api_key(request: Request) -> None:
    """401 unless ``Authorization: Bearer <key>`` matches the server's API key (if it has
    one)."""
    key = _server(request).config.api_key
    if key is None:
        return
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or token.strip() != key:
        raise APIError(
            401,
            "Incorrect or missing API key: send `Authorization: Bearer <key>`",
            code="invalid_api_key",
        )


async def request_body(request: Request) -> bytes:
    """The raw body, 413 past ``max_request_bytes`` (by ``Content-Length`` or as read)."""
    limit = _server(request).config.max_request_bytes
    length = request.headers.get("content-length")
    too_big = APIError(
        413, f"request body exceeds the limit of {limit} bytes", code="request_too_large"
    )
    if length is not None:
        try:
            if int(length) > limit:
                raise too_big
        except ValueError:
            raise APIError(400, "invalid Content-Length header") from None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_big
        chunks.append(chunk)
    return b"".join(chunks)


# -- routes ------------------------------------------------------------------------------------
def _body_schema(model: type) -> dict[str, Any]:
    ref = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {
        "requestBody": {"required": True, "content": {"application/json": {"schema": ref}}},
        "responses": {
            "400": {"description": "invalid request (OpenAI error shape)"},
            "404": {"description": "unknown model"},
            "429": {"description": "overloaded; see Retry-After"},
        },
    }


open_routes = APIRouter()
v1 = APIRouter(prefix="/v1", dependencies=[Depends(require_api_key)])
tokens = APIRouter(dependencies=[Depends(require_api_key)])  # vLLM's /tokenize, /detokenize


@open_routes.head("/health", include_in_schema=False)  # load balancers' probes
@open_routes.get("/health")
async def health(request: Request):
    body = _server(request).frontend.readiness()
    if not body["ready"]:
        return JSONResponse(body, status_code=503, headers={"Retry-After": "2"})
    return body


@open_routes.get("/metrics")
async def metrics(request: Request):
    return Response(_server(request).metrics.render(), media_type=CONTENT_TYPE)


@v1.get("/models")
async def models(request: Request):
    server = _server(request)
    data = [model_card(server, name) for name in server.model_names]
    return {"object": "list", "data": data}


@v1.get("/models/{model_id:path}")
async def model(request: Request, model_id: str):
    return model_card(_server(request), model_id)


@tokens.post("/tokenize", openapi_extra=_body_schema(TokenizeRequest))
async def tokenize_route(request: Request, body: bytes = Depends(request_body)):
    server = _server(request)
    return await _on_text_worker(server, tokenize, server, parse(TokenizeRequest, body))


@tokens.post("/detokenize", openapi_extra=_body_schema(DetokenizeRequest))
async def detokenize_route(request: Request, body: bytes = Depends(request_body)):
    server = _server(request)
    return await _on_text_worker(server, detokenize, server, parse(DetokenizeRequest, body))


async def _on_text_worker(server: Server, fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` on the server's text thread: tokenizing a long prompt or rendering a
    chat template there leaves the event loop free to stream other requests' tokens."""
    return await asyncio.get_running_loop().run_in_executor(server.text_worker, fn, *args)


async def _answer(request: Request, body: bytes, model: type, make_plan, fmt: type) -> Any:
    """Parse ``body`` as ``model``, plan and submit it, answer in the response format ``fmt``."""
    server = _server(request)
    req = parse(model, body)
    plan = await _on_text_worker(server, make_plan, server, req)
    submitted = oreq.submit(server, plan)
    return await respond(server, request, fmt(server, req, plan, submitted))


@v1.post("/completions", openapi_extra=_body_schema(CompletionRequest))
async def completions(request: Request, body: bytes = Depends(request_body)):
    return await _answer(request, body, CompletionRequest, oreq.completion_plan, CompletionFormat)


@v1.post("/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
async def chat_completions(request: Request, body: bytes = Depends(request_body)):
    return await _answer(request, body, ChatCompletionRequest, oreq.chat_plan, ChatFormat)


@v1.post("/embeddings", openapi_extra=_body_schema(EmbeddingRequest))
async def create_embeddings(request: Request, body: bytes = Depends(request_body)):
    server = _server(request)
    req = parse(EmbeddingRequest, body)
    plan = await _on_text_worker(server, emb.embedding_plan, server, req)
    keys, sub = emb.submit(server, plan)
    found = await embeddings(server, request, sub)
    if found is None:  # the client went away; its sequences were cancelled
        return Response(status_code=204)
    return emb.embedding_body(server, plan, [found[k].vector for k in keys], req.encoding_format)


# -- errors ------------------------------------------------------------------------------------
def error_response(server: Server, exc: APIError) -> JSONResponse:
    server.metrics.errors.labels(exc.instance or "frontend", exc.type).inc()
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def _api_error(request: Request, exc: APIError):
    return error_response(_server(request), exc)


async def _validation(request: Request, exc: RequestValidationError):
    return error_response(_server(request), APIError(400, f"invalid request: {exc.errors()[:1]}"))


async def _http(request: Request, exc: StarletteHTTPException):
    kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
    err = APIError(exc.status_code, str(exc.detail), kind, headers=dict(exc.headers or {}))
    return error_response(_server(request), err)


async def _internal(request: Request, exc: Exception):
    log.exception("unhandled error on %s", request.url.path)
    return error_response(
        _server(request),
        APIError(500, f"internal server error: {type(exc).__name__}", "internal_error"),
    )


# -- the app -----------------------------------------------------------------------------------
def _openapi(app: FastAPI) -> dict[str, Any]:
    """The generated schema plus the request models the bodies refer to."""
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    for model in (CompletionRequest, ChatCompletionRequest, EmbeddingRequest):
        js = model.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(js.pop("$defs", {}))
        components[model.__name__] = js
    app.openapi_schema = schema
    return schema


def create_app(server: Server) -> FastAPI:
    """The FastAPI app serving ``server``; its engines start and stop with the app."""

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        server.frontend.start()
        # listen once the engines are warm: a request (or the grammar's tokenizer conversion,
        # seconds of CPU for a large vocabulary) during the warm-up skews its prefill rate
        loop = asyncio.get_running_loop()
        if not await loop.run_in_executor(None, server.frontend.wait_warm, WARM_UP_TIMEOUT_S):
            log.warning("engines still warming up after %.0f s; serving", WARM_UP_TIMEOUT_S)
        threading.Thread(target=server.grammar.warm, name="pace-grammar", daemon=True).start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, server.frontend.shutdown)
            server.text_worker.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="pace", version="0.1.0", lifespan=lifespan)
    app.state.server = server
    app.add_exception_handler(APIError, _api_error)
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(Exception, _internal)
    app.include_router(open_routes)
    app.include_router(v1)
    app.include_router(tokens)
    if server.config.ui:
        app.include_router(chat_page)  # the chat page at / (off: `pace serve --no-ui`)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app


__all__ = ["Server", "ServerConfig", "create_app", "error_body", "require_api_key"]
