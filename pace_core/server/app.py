"""The OpenAI-compatible HTTP front door (FastAPI).

``create_app(server)`` builds the app for a :class:`Server`, which owns the tokenizer, the
engine instances (one in-process engine thread by default, or N engine processes), the
:class:`~pace_core.server.frontend.Frontend` that routes to them, and the metrics.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pace_core.errors import ConfigError
from pace_core.sampling.config import SamplingConfig
from pace_core.server.engine import EngineConfig, LocalEngine, SeqSpec, context_window
from pace_core.server.frontend import Frontend, Submission
from pace_core.server.metrics import CONTENT_TYPE, Metrics
from pace_core.server.protocol import (
    APIError,
    ChatCompletionRequest,
    CompletionRequest,
    error_body,
    parse,
)
from pace_core.speculative.stats import SpecStats

log = logging.getLogger("pace.server")

MAX_SEQUENCES = 256  # prompts x n of one request
_GEN_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass
class ServerConfig:
    """Front-door settings (the scheduler's are in :class:`EngineConfig`)."""

    served_model_name: str = "smollm2"
    aliases: tuple[str, ...] = ()
    api_key: str | None = None
    max_request_bytes: int = 4 << 20
    request_timeout: float | None = 600.0
    default_max_tokens: int = 1024  # chat requests without max_tokens (see docs/server.md)


class TokenText:
    """Token id -> display string and UTF-8 bytes (for logprobs), cached."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._cache: dict[int, tuple[str, list[int]]] = {}
        try:
            from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

            self._byte_decoder = {c: b for b, c in bytes_to_unicode().items()}
        except Exception:  # pragma: no cover - transformers layout changed
            self._byte_decoder = {}

    def get(self, token: int) -> tuple[str, list[int]]:
        found = self._cache.get(token)
        if found is None:
            text = self.tokenizer.decode([token])
            raw = self.tokenizer.convert_ids_to_tokens(token)
            if isinstance(raw, str) and raw and all(c in self._byte_decoder for c in raw):
                data = [self._byte_decoder[c] for c in raw]  # byte-level BPE
            else:
                data = list(text.encode("utf-8"))
            found = self._cache[token] = (text, data)
        return found


def _finite(x: float | None) -> float | None:
    if x is None:
        return None
    return x if math.isfinite(x) else -9999.0


class Server:
    """Everything the HTTP handlers need; see :func:`create_app`."""

    def __init__(
        self,
        tokenizer: Any,
        instances: list[Any],
        engine_config: EngineConfig,
        config: ServerConfig,
        *,
        max_context: int,
        vocab_size: int,
        generation_config: dict[str, Any] | None = None,
        speculative: bool = False,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config
        self.engine_config = engine_config
        self.max_context = max_context
        self.vocab_size = vocab_size
        gen = generation_config or {}
        self.gen_defaults = {k: gen[k] for k in _GEN_DEFAULT_KEYS if gen.get(k) is not None}
        self.speculative = speculative
        self.metrics = Metrics(speculative)
        self.frontend = Frontend(
            instances,
            self.metrics,
            max_running=engine_config.max_running,
            max_queue=engine_config.max_queue,
        )
        self.token_text = TokenText(tokenizer)
        self.created = int(time.time())

    # -- constructors ----------------------------------------------------------------------
    @classmethod
    def in_process(
        cls, llm: Any, engine_config: EngineConfig | None = None, config: ServerConfig | None = None
    ) -> Server:
        """One engine thread on an already loaded :class:`~pace_core.engine.llm.LLMModel`."""
        engine_config = engine_config or EngineConfig()
        instance = LocalEngine(llm, engine_config, "0")
        # The engine thread decodes with llm.tokenizer; the front door encodes with its own
        # copy: a Rust-backed tokenizer shared by an encoding and another thread can raise
        # "Already borrowed" (transformers resets truncation/padding state on encode).
        try:
            tokenizer = copy.deepcopy(llm.tokenizer)
        except Exception:  # pragma: no cover - an exotic tokenizer that cannot be copied
            tokenizer = llm.tokenizer
        return cls(
            tokenizer,
            [instance],
            engine_config,
            config or ServerConfig(),
            max_context=context_window(llm),
            vocab_size=llm.model.vocab_size,
            generation_config=llm.generation_config,
            speculative=getattr(llm, "speculator", None) is not None,
        )

    @classmethod
    def multi_instance(
        cls,
        model_args: dict[str, Any],
        instances: int,
        engine_config: EngineConfig | None = None,
        config: ServerConfig | None = None,
        cores: list[int] | None = None,
    ) -> Server:
        """``instances`` engine processes with partitioned cores; loads only the tokenizer."""
        from transformers import AutoTokenizer

        from pace_core.models.loader import load_config, resolve_model_path
        from pace_core.server.multi import ProcessEngine, partition_cores

        engine_config = engine_config or EngineConfig()
        path = resolve_model_path(model_args["model"])
        model_args = {**model_args, "model": str(path), "quiet": True}
        hf_config = load_config(path)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        gen = _generation_config(path)
        ctx = getattr(hf_config, "max_position_embeddings", None) or 4096
        vocab = getattr(hf_config, "vocab_size", None) or len(tokenizer)
        groups = partition_cores(instances, cores)
        engines = [
            ProcessEngine(str(i), model_args, engine_config, groups[i]) for i in range(instances)
        ]
        return cls(
            tokenizer,
            engines,
            engine_config,
            config or ServerConfig(),
            max_context=int(ctx),
            vocab_size=int(vocab),
            generation_config=gen,
            speculative=model_args.get("spec_config") is not None,
        )

    # -- request handling helpers ----------------------------------------------------------
    @property
    def model_names(self) -> tuple[str, ...]:
        return (self.config.served_model_name, *self.config.aliases)

    def check_model(self, name: str | None) -> None:
        if name is not None and name not in self.model_names:
            raise APIError(
                404,
                f"The model `{name}` does not exist. Available: {', '.join(self.model_names)}",
                param="model",
                code="model_not_found",
            )

    def authorize(self, request: Request) -> None:
        key = self.config.api_key
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

    async def read_body(self, request: Request) -> bytes:
        limit = self.config.max_request_bytes
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

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=True)["input_ids"])

    def check_prompt(self, ids: Sequence[int], what: str = "prompt") -> None:
        if not ids:
            raise APIError(400, f"{what} is empty: it needs at least one token", param="prompt")
        bad = [t for t in ids if t >= self.vocab_size]
        if bad:
            raise APIError(
                400,
                f"{what} has token id {bad[0]} outside the vocabulary [0, {self.vocab_size})",
                param="prompt",
            )

    def chat_prompt(self, req: ChatCompletionRequest) -> list[int]:
        if not getattr(self.tokenizer, "chat_template", None):
            raise APIError(
                400,
                "this model has no chat template: use /v1/completions",
                param="messages",
                code="no_chat_template",
            )
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        try:
            ids = self.tokenizer.apply_chat_template(
                messages, add_generation_prompt=req.add_generation_prompt, tokenize=True
            )
        except Exception as exc:  # jinja raise_exception, bad roles, ...
            raise APIError(400, f"chat template failed: {exc}", param="messages") from None
        if isinstance(ids, dict) or hasattr(ids, "keys"):
            ids = ids["input_ids"]
        return list(ids)

    def max_tokens(self, requested: int | None, prompt_len: int, default: int | None) -> int:
        """The request's generation budget, checked against the context window and the KV
        pool (a request is booked ``prompt + max_tokens`` tokens of KV, see engine.py)."""
        room = self.max_context - prompt_len
        cap = self.frontend.capacity_tokens()
        if requested is None:
            if room < 1:
                raise self._context_error(prompt_len, 1)
            budget = min(room, default) if default else room
            if cap is not None:
                budget = min(budget, cap - prompt_len)
            if budget < 1:
                raise self._kv_error(prompt_len, 1, cap)
            return budget
        if prompt_len + requested > self.max_context:
            raise self._context_error(prompt_len, requested)
        if cap is not None and prompt_len + requested > cap:
            raise self._kv_error(prompt_len, requested, cap)
        return requested

    def _kv_error(self, prompt_len: int, requested: int, cap: int | None) -> APIError:
        return APIError(
            400,
            f"prompt ({prompt_len} tokens) + max_tokens ({requested}) needs more KV cache "
            f"than this server holds ({cap} tokens); lower max_tokens",
            param="max_tokens",
            code="kv_cache_too_small",
        )

    def _context_error(self, prompt_len: int, requested: int) -> APIError:
        return APIError(
            400,
            f"This model's maximum context length is {self.max_context} tokens. However, you "
            f"requested {prompt_len + requested} tokens ({prompt_len} in the prompt, "
            f"{requested} for the completion). Please reduce the prompt or max_tokens.",
            param="max_tokens",
            code="context_length_exceeded",
        )

    def sampling(self, req: Any, max_tokens: int, logprobs: int | None, index: int):
        d = self.gen_defaults
        temperature = req.temperature if req.temperature is not None else d.get("temperature", 1.0)
        top_k = req.top_k if req.top_k is not None else d.get("top_k", 0)
        bias = None
        if req.logit_bias:
            bias = {int(k): float(v) for k, v in req.logit_bias.items()}
            bad = [k for k in bias if k >= self.vocab_size]
            if bad:
                raise APIError(
                    400,
                    f"logit_bias token id {bad[0]} is outside the vocabulary "
                    f"[0, {self.vocab_size})",
                    param="logit_bias",
                )
        try:
            return SamplingConfig(
                max_new_tokens=max_tokens,
                min_new_tokens=req.min_tokens,
                do_sample=temperature > 0,
                temperature=float(temperature),
                top_k=max(0, int(top_k)),
                top_p=float(req.top_p if req.top_p is not None else d.get("top_p", 1.0)),
                min_p=float(req.min_p if req.min_p is not None else d.get("min_p", 0.0)),
                repetition_penalty=float(
                    req.repetition_penalty
                    if req.repetition_penalty is not None
                    else d.get("repetition_penalty", 1.0)
                ),
                frequency_penalty=float(req.frequency_penalty or 0.0),
                presence_penalty=float(req.presence_penalty or 0.0),
                logit_bias=bias,
                ignore_eos=req.ignore_eos,
                stop=req.stop,
                seed=None if req.seed is None else (req.seed + index) % 2**64,
                logprobs=logprobs,
            )
        except (ValueError, ConfigError) as exc:
            raise APIError(400, str(exc)) from None

    def submit(self, prompts: list[list[int]], configs: list[SamplingConfig], n: int):
        """One SeqSpec per (prompt, choice); returns (request id, keys in choice order, sub)."""
        if len(prompts) * n > MAX_SEQUENCES:
            raise APIError(
                400,
                f"the request asks for {len(prompts) * n} sequences (prompts x n); "
                f"at most {MAX_SEQUENCES} are allowed",
                param="n",
            )
        rid = f"{uuid.uuid4().hex[:16]}"
        specs, keys = [], []
        for p, prompt in enumerate(prompts):
            for j in range(n):
                key = f"{rid}:{p * n + j}"
                specs.append(SeqSpec(key, prompt, configs[p * n + j]))
                keys.append(key)
        sub = self.frontend.submit(rid, specs, sum(len(p) for p in prompts))
        return rid, keys, sub

    def usage(self, sub: Submission, prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
        """OpenAI ``usage``; with speculative decoding plus ``spec_decode``: the request's
        counters (:class:`~pace_core.speculative.stats.SpecStats`, all choices summed; an extra
        field, which the OpenAI client keeps in ``usage.model_extra``)."""
        out: dict[str, Any] = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        }
        if self.speculative:
            stats = (sub.spec or SpecStats()).to_dict()
            out["spec_decode"] = {k: v for k, v in stats.items() if not k.endswith("_seconds")}
        return out

    def error_response(self, exc: APIError) -> JSONResponse:
        self.metrics.errors.labels(exc.instance or "frontend", exc.type).inc()
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


def _generation_config(path: Any) -> dict[str, Any]:
    file = Path(path) / "generation_config.json"
    try:
        return json.loads(file.read_text()) if file.exists() else {}
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{file} is not readable JSON: {exc}") from None


async def _wait_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


class _Timeout(Exception):
    pass


async def _events(
    server: Server, sub: Submission, request: Request | None, watch_disconnect: bool
) -> AsyncIterator[tuple]:
    """The submission's events until all its sequences finished; cancels on exit."""
    timeout = server.config.request_timeout
    deadline = None if timeout is None else sub.created + timeout
    disconnect = asyncio.ensure_future(_wait_disconnect(request)) if watch_disconnect else None
    try:
        while not (sub.done and sub.queue.empty()):
            if sub.queue.empty():
                get = asyncio.ensure_future(sub.queue.get())
                waits = {get} if disconnect is None else {get, disconnect}
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                done, _ = await asyncio.wait(
                    waits, timeout=left, return_when=asyncio.FIRST_COMPLETED
                )
                if get not in done:
                    get.cancel()
                    if disconnect is not None and disconnect in done:
                        return
                    raise _Timeout()
                yield get.result()
            else:
                yield sub.queue.get_nowait()
    finally:
        if disconnect is not None:
            disconnect.cancel()
        if not sub.done:
            server.frontend.cancel(sub)


def _timeout_error(server: Server) -> APIError:
    return APIError(
        408,
        f"the request did not finish within the server's request timeout "
        f"({server.config.request_timeout} s)",
        "timeout_error",
        code="request_timeout",
    )


def _engine_error(server: Server, sub: Submission, ev: tuple) -> APIError:
    _, _, message, etype, status = ev
    headers = {"Retry-After": "1"} if status in (429, 503) else None
    instance = server.frontend.instances[sub.instance].name
    return APIError(status, message, etype, headers=headers, instance=instance)


class _Choice:
    """Accumulates one choice (sequence) of a non-streaming response."""

    __slots__ = ("finish", "logprobs", "text", "tokens")

    def __init__(self) -> None:
        self.text: list[str] = []
        self.tokens = 0
        self.logprobs: list[tuple] = []
        self.finish: str | None = None


async def _collect(server: Server, sub: Submission, keys: list[str], request: Request):
    choices = {k: _Choice() for k in keys}
    try:
        async with contextlib.aclosing(_events(server, sub, request, True)) as events:
            async for ev in events:
                if ev[0] == "err":
                    raise _engine_error(server, sub, ev)
                c = choices[ev[1]]
                c.text.append(ev[3])
                c.tokens += 1
                if ev[5] is not None:
                    c.logprobs.append((ev[2], ev[5], ev[6], ev[7]))
                c.finish = ev[4] or c.finish
    except _Timeout:
        raise _timeout_error(server) from None
    return [choices[k] for k in keys]


def _sse(payload: Any) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


class _CompletionLogprobs:
    """OpenAI completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""

    def __init__(self, server: Server, offset: int) -> None:
        self.tt = server.token_text
        self.offset = offset

    def build(self, items: list[tuple]) -> dict[str, Any]:
        tokens, lps, tops, offsets = [], [], [], []
        for token, lp, ids, vals in items:
            text = self.tt.get(token)[0]
            tokens.append(text)
            lps.append(_finite(lp))
            top = {}
            for i, v in zip(ids or (), vals or ()):
                if i >= 0:
                    top[self.tt.get(i)[0]] = _finite(v)
            tops.append(top)
            offsets.append(self.offset)
            self.offset += len(text)
        return {
            "tokens": tokens,
            "token_logprobs": lps,
            "top_logprobs": tops,
            "text_offset": offsets,
        }


def _chat_logprobs(server: Server, items: list[tuple]) -> dict[str, Any]:
    tt = server.token_text
    content = []
    for token, lp, ids, vals in items:
        text, data = tt.get(token)
        top = []
        for i, v in zip(ids or (), vals or ()):
            if i >= 0:
                t, b = tt.get(i)
                top.append({"token": t, "logprob": _finite(v), "bytes": b})
        content.append({"token": text, "logprob": _finite(lp), "bytes": data, "top_logprobs": top})
    return {"content": content}


async def _with_first(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield first
    async for item in rest:
        yield item


async def _stream_body(
    server: Server,
    sub: Submission,
    keys: list[str],
    make_chunk: Any,
    finish_chunk: Any,
    usage_chunk: Any,
    prompt_tokens: int,
) -> AsyncIterator[bytes]:
    """SSE body shared by both endpoints; errors become a ``data: {"error": ...}`` payload."""
    index = {k: i for i, k in enumerate(keys)}
    completion_tokens = 0
    try:
        async with contextlib.aclosing(_events(server, sub, None, False)) as events:
            async for ev in events:
                if ev[0] == "err":
                    err = _engine_error(server, sub, ev)
                    server.metrics.errors.labels(err.instance, err.type).inc()
                    yield _sse(err.body())
                    break
                completion_tokens += 1
                i = index[ev[1]]
                chunk = make_chunk(i, ev)
                if chunk is not None:
                    yield _sse(chunk)
                if ev[4] is not None and finish_chunk is not None:
                    yield _sse(finish_chunk(i, ev[4]))
            else:
                if usage_chunk is not None:
                    usage = server.usage(sub, prompt_tokens, completion_tokens)
                    yield _sse(usage_chunk(usage))
    except _Timeout:
        err = _timeout_error(server)
        server.metrics.errors.labels("frontend", err.type).inc()
        yield _sse(err.body())
    yield b"data: [DONE]\n\n"


def _stream_response(body: AsyncIterator[bytes]) -> StreamingResponse:
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )


# -- the app -----------------------------------------------------------------------------------
def create_app(server: Server) -> FastAPI:
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        server.frontend.start()
        try:
            yield
        finally:
            await asyncio.get_running_loop().run_in_executor(None, server.frontend.shutdown)

    app = FastAPI(title="pace", version="0.1.0", lifespan=lifespan)
    app.state.server = server

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError):
        return server.error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError):
        return server.error_response(APIError(400, f"invalid request: {exc.errors()[:1]}"))

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return server.error_response(
            APIError(exc.status_code, str(exc.detail), kind, headers=dict(exc.headers or {}))
        )

    @app.exception_handler(Exception)
    async def _internal(request: Request, exc: Exception):
        log.exception("unhandled error on %s", request.url.path)
        return server.error_response(
            APIError(500, f"internal server error: {type(exc).__name__}", "internal_error")
        )

    @app.get("/health")
    async def health():
        if not server.frontend.healthy:
            return JSONResponse(
                {"status": "starting"}, status_code=503, headers={"Retry-After": "2"}
            )
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(server.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models(request: Request):
        server.authorize(request)
        data = [
            {
                "id": name,
                "object": "model",
                "created": server.created,
                "owned_by": "pace",
                "max_model_len": server.max_context,
            }
            for name in server.model_names
        ]
        return {"object": "list", "data": data}

    @app.post("/v1/completions", openapi_extra=_body_schema(CompletionRequest))
    async def completions(request: Request):
        server.authorize(request)
        req: CompletionRequest = parse(CompletionRequest, await server.read_body(request))
        server.check_model(req.model)
        if req.suffix:
            raise APIError(400, "suffix is not supported", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise APIError(400, "best_of must equal n (or be omitted)", param="best_of")
        if req.echo and req.logprobs is not None:
            raise APIError(400, "echo with logprobs is not supported", param="echo")
        p = req.prompt
        if isinstance(p, str):
            prompts = [server.encode(p)]
        elif p and isinstance(p[0], str):
            prompts = [server.encode(s) for s in p]
        elif p and isinstance(p[0], int):
            prompts = [list(p)]
        else:
            prompts = [list(x) for x in p]
        if not prompts:
            raise APIError(400, "prompt is empty", param="prompt")
        configs = []
        for prompt in prompts:
            server.check_prompt(prompt)
            mt = server.max_tokens(req.max_tokens, len(prompt), None)
            configs += [server.sampling(req, mt, req.logprobs, j) for j in range(req.n)]
        echo = [server.tokenizer.decode(x) if req.echo else "" for x in prompts]
        rid, keys, sub = server.submit(prompts, configs, req.n)
        created, model = int(time.time()), server.config.served_model_name
        prompt_tokens = sum(len(x) for x in prompts)
        base = {
            "id": f"cmpl-{rid}",
            "object": "text_completion",
            "created": created,
            "model": model,
        }

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            logprobs = [
                _CompletionLogprobs(server, len(echo[i // req.n])) for i in range(len(keys))
            ]
            started = [False] * len(keys)

            def chunk(i: int, ev: tuple) -> dict | None:
                text = ev[3]
                if not started[i]:
                    started[i] = True
                    text = echo[i // req.n] + text
                if not text and ev[4] is None and ev[5] is None:
                    return None
                lp = None
                if ev[5] is not None:
                    lp = logprobs[i].build([(ev[2], ev[5], ev[6], ev[7])])
                c = {"index": i, "text": text, "logprobs": lp, "finish_reason": ev[4]}
                out = {**base, "choices": [c]}
                if include_usage:
                    out["usage"] = None
                return out

            usage = (lambda u: {**base, "choices": [], "usage": u}) if include_usage else None
            body = _stream_body(server, sub, keys, chunk, None, usage, prompt_tokens)
            return _stream_response(body)

        choices = await _collect(server, sub, keys, request)
        out = []
        for i, c in enumerate(choices):
            prefix = echo[i // req.n]
            lp = None
            if req.logprobs is not None:
                lp = _CompletionLogprobs(server, len(prefix)).build(c.logprobs)
            text = prefix + "".join(c.text)
            out.append({"index": i, "text": text, "logprobs": lp, "finish_reason": c.finish})
        usage = server.usage(sub, prompt_tokens, sum(c.tokens for c in choices))
        return {**base, "choices": out, "usage": usage}

    @app.post("/v1/chat/completions", openapi_extra=_body_schema(ChatCompletionRequest))
    async def chat_completions(request: Request):
        server.authorize(request)
        req: ChatCompletionRequest = parse(ChatCompletionRequest, await server.read_body(request))
        server.check_model(req.model)
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
        prompt = server.chat_prompt(req)
        server.check_prompt(prompt, "the chat prompt")
        requested = req.max_completion_tokens or req.max_tokens
        mt = server.max_tokens(requested, len(prompt), server.config.default_max_tokens)
        k = (req.top_logprobs or 0) if req.logprobs else None
        configs = [server.sampling(req, mt, k, j) for j in range(req.n)]
        rid, keys, sub = server.submit([prompt], configs, req.n)
        created, model = int(time.time()), server.config.served_model_name
        base = {
            "id": f"chatcmpl-{rid}",
            "object": "chat.completion",
            "created": created,
            "model": model,
        }

        if req.stream:
            include_usage = bool(req.stream_options and req.stream_options.include_usage)
            base["object"] = "chat.completion.chunk"

            def wrap(choice: dict) -> dict:
                out = {**base, "choices": [choice]}
                if include_usage:
                    out["usage"] = None
                return out

            def chunk(i: int, ev: tuple) -> dict | None:
                if not ev[3] and ev[5] is None:
                    return None
                lp = None
                if ev[5] is not None:
                    lp = _chat_logprobs(server, [(ev[2], ev[5], ev[6], ev[7])])
                delta = {"content": ev[3]}
                return wrap({"index": i, "delta": delta, "logprobs": lp, "finish_reason": None})

            def finish(i: int, reason: str) -> dict:
                return wrap({"index": i, "delta": {}, "logprobs": None, "finish_reason": reason})

            role = b"".join(
                _sse(
                    wrap(
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    )
                )
                for i in range(len(keys))
            )
            usage = (lambda u: {**base, "choices": [], "usage": u}) if include_usage else None
            body = _stream_body(server, sub, keys, chunk, finish, usage, len(prompt))
            return _stream_response(_with_first(role, body))

        choices = await _collect(server, sub, keys, request)
        out = []
        for i, c in enumerate(choices):
            lp = _chat_logprobs(server, c.logprobs) if req.logprobs else None
            message = {"role": "assistant", "content": "".join(c.text)}
            out.append({"index": i, "message": message, "logprobs": lp, "finish_reason": c.finish})
        usage = server.usage(sub, len(prompt), sum(c.tokens for c in choices))
        return {**base, "choices": out, "usage": usage}

    def openapi() -> dict[str, Any]:
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for model in (CompletionRequest, ChatCompletionRequest):
            js = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(js.pop("$defs", {}))
            components[model.__name__] = js
        app.openapi_schema = schema
        return schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


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


__all__ = ["Server", "ServerConfig", "create_app", "error_body"]
