"""OpenAI requests -> engine work: token prompts, a :class:`SamplingConfig` per choice, and
the :class:`~pace_core.engine.events.SeqSpec` submission.

Every check a request can fail before it reaches an engine is here (unknown model, empty or
out-of-vocabulary prompts, the context window and KV pool, sampling values), each a 400/404
:class:`~pace_core.server.api.protocol.APIError`.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from pace_core.engine.events import SeqSpec
from pace_core.errors import ConfigError
from pace_core.sampling.config import SamplingConfig
from pace_core.server.api.protocol import APIError, ChatCompletionRequest, CompletionRequest
from pace_core.server.api.tools import ToolFormat, ToolPlan, plan_tools
from pace_core.server.frontdoor.context import ServingContext
from pace_core.server.frontdoor.frontend import Submission

MAX_SEQUENCES = 256  # prompts x n of one request
_GEN_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def sampling_defaults(generation_config: dict[str, Any] | None) -> dict[str, Any]:
    """The model's ``generation_config.json`` values for the request fields it may default."""
    gen = generation_config or {}
    return {k: gen[k] for k in _GEN_DEFAULT_KEYS if gen.get(k) is not None}


@dataclass
class Plan:
    """What one request asks of the engines: ``n`` choices of every prompt."""

    prompts: list[list[int]]
    configs: list[SamplingConfig]  # one per (prompt, choice), in choice order
    n: int
    echo: list[str] | None = None  # completions: the text prepended to each prompt's choices
    tool_format: ToolFormat | None = None  # chat: parse the output for calls in this format
    cache_salt: str = ""  # the request's prefix-cache namespace (tenant isolation)
    score_only: bool = False  # completions' echo with max_tokens 0: the one token drawn is dropped

    @property
    def prompt_tokens(self) -> int:
        return sum(len(p) for p in self.prompts)


@dataclass
class Submitted:
    """A plan handed to the front door: the request id, its sequence keys in choice order,
    and the :class:`Submission` their events arrive on."""

    rid: str
    keys: list[str]
    sub: Submission


# -- the two endpoints -------------------------------------------------------------------------
def completion_plan(server: ServingContext, req: CompletionRequest) -> Plan:
    check_model(server, req.model)
    if req.suffix:
        raise APIError(400, "suffix is not supported", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise APIError(400, "best_of must equal n (or be omitted)", param="best_of")
    score_only = req.max_tokens == 0  # the prompt echoed (and scored), no token generated
    if score_only and not req.echo:
        raise APIError(
            400, "max_tokens 0 answers nothing without echo: set echo or max_tokens >= 1",
            param="max_tokens",
        )  # fmt: skip
    p = req.prompt
    texts: list[str | None]  # a prompt given as text, echoed as sent
    if isinstance(p, str):
        prompts, texts = [encode(server, p)], [p]
    elif p and isinstance(p[0], str):
        prompts, texts = [encode(server, s) for s in p], list(p)
    elif p and isinstance(p[0], int):
        prompts = [list(p)]
        texts = [None]
    else:
        prompts = [list(x) for x in p]
        texts = [None] * len(prompts)
    if not prompts:
        raise APIError(400, "prompt is empty", param="prompt")
    constraint = Constraint(json_schema=response_schema(req))
    scored = req.logprobs if req.echo else None  # echo with logprobs: each choice's prompt
    configs = []
    for prompt in prompts:
        check_prompt(server, prompt)
        requested = 1 if score_only else req.max_tokens  # null: the server's default, as chat
        mt = max_tokens(server, requested, len(prompt), server.config.default_max_tokens)
        configs += [
            sampling(server, req, mt, req.logprobs, j, constraint, prompt_logprobs=scored)
            for j in range(req.n)
        ]
    check_constraint(server, configs)
    # echoed: the prompt as sent (vLLM's rule); token ids, or with logprobs (whose text_offset
    # index the echo), the prompt's tokens spelt out, special ones included
    echo = [
        ("" if not req.echo else text if text is not None and not scored
         else server.tokenizer.decode(ids))
        for ids, text in zip(prompts, texts)
    ]  # fmt: skip
    return Plan(
        prompts, configs, req.n, echo, cache_salt=req.cache_salt or "", score_only=score_only
    )


def chat_plan(server: ServingContext, req: ChatCompletionRequest) -> Plan:
    check_model(server, req.model)
    if req.top_logprobs is not None and not req.logprobs:
        raise APIError(400, "top_logprobs requires logprobs=true", param="top_logprobs")
    tools = plan_tools(req, getattr(server.tokenizer, "chat_template", None))
    schema = response_schema(req)
    if schema is not None and tools.grammar is not None:
        raise APIError(
            400,
            "response_format cannot be combined with tool_choice 'required' or a named tool: "
            "both constrain the output",
            param="response_format",
        )
    prompt = chat_prompt(server, req, tools)
    check_prompt(server, prompt, "the chat prompt")
    requested = req.max_completion_tokens or req.max_tokens
    mt = max_tokens(server, requested, len(prompt), server.config.default_max_tokens)
    k = (req.top_logprobs or 0) if req.logprobs else None
    constraint = Constraint(json_schema=schema, grammar=tools.grammar)
    configs = [sampling(server, req, mt, k, j, constraint) for j in range(req.n)]
    check_constraint(server, configs)
    salt = req.cache_salt or ""
    return Plan([prompt], configs, req.n, tool_format=tools.format, cache_salt=salt)


def submit(server: ServingContext, plan: Plan) -> Submitted:
    """One SeqSpec per (prompt, choice), routed to one instance (429/503 when none fits)."""
    n = plan.n
    if len(plan.prompts) * n > MAX_SEQUENCES:
        raise APIError(
            400,
            f"the request asks for {len(plan.prompts) * n} sequences (prompts x n); "
            f"at most {MAX_SEQUENCES} are allowed",
            param="n",
        )
    rid = f"{uuid.uuid4().hex[:16]}"
    specs, keys = [], []
    for p, prompt in enumerate(plan.prompts):
        for j in range(n):
            key = f"{rid}:{p * n + j}"
            specs.append(SeqSpec(key, prompt, plan.configs[p * n + j], cache_salt=plan.cache_salt))
            keys.append(key)
    sub = server.frontend.submit(rid, specs, plan.prompt_tokens)
    return Submitted(rid, keys, sub)


# -- checks and pieces -------------------------------------------------------------------------
def check_model(server: ServingContext, name: str | None) -> None:
    if name is not None and name not in server.model_names:
        raise APIError(
            404,
            f"The model `{name}` does not exist. Available: {', '.join(server.model_names)}",
            param="model",
            code="model_not_found",
        )


def encode(server: ServingContext, text: str) -> list[int]:
    return list(server.tokenizer(text, add_special_tokens=True)["input_ids"])


def check_prompt(server: ServingContext, ids: Sequence[int], what: str = "prompt") -> None:
    if not ids:
        raise APIError(400, f"{what} is empty: it needs at least one token", param="prompt")
    check_vocab(server, ids, f"{what} has token id", "prompt")


def check_vocab(server: ServingContext, ids: Iterable[int], what: str, param: str) -> None:
    """A 400 naming the first id outside the model's vocabulary."""
    bad = [t for t in ids if t >= server.vocab_size]
    if bad:
        raise APIError(
            400, f"{what} {bad[0]} outside the vocabulary [0, {server.vocab_size})", param=param
        )


def chat_prompt(server: ServingContext, req: ChatCompletionRequest, tools: ToolPlan) -> list[int]:
    tokenizer = server.tokenizer
    if not getattr(tokenizer, "chat_template", None):
        raise APIError(
            400,
            "this model has no chat template: use /v1/completions",
            param="messages",
            code="no_chat_template",
        )
    extra = {} if tools.template_tools is None else {"tools": tools.template_tools}
    try:
        ids = tokenizer.apply_chat_template(
            tools.messages, add_generation_prompt=req.add_generation_prompt, tokenize=True, **extra
        )
    except Exception as exc:  # jinja raise_exception, bad roles, ...
        raise APIError(400, f"chat template failed: {exc}", param="messages") from None
    if isinstance(ids, dict) or hasattr(ids, "keys"):
        ids = ids["input_ids"]
    return list(ids)


def max_tokens(
    server: ServingContext, requested: int | None, prompt_len: int, default: int | None
) -> int:
    """The request's generation budget, checked against the context window and the KV pool
    (a request is booked ``prompt + max_tokens`` tokens of KV, see engine.py)."""
    room = server.max_context - prompt_len
    cap = server.frontend.capacity_tokens()
    if requested is None:
        if room < 1:
            raise _context_error(server, prompt_len, 1)
        budget = min(room, default) if default else room
        if cap is not None:
            budget = min(budget, cap - prompt_len)
        if budget < 1:
            raise _kv_error(prompt_len, 1, cap)
        return budget
    if prompt_len + requested > server.max_context:
        raise _context_error(server, prompt_len, requested)
    if cap is not None and prompt_len + requested > cap:
        raise _kv_error(prompt_len, requested, cap)
    return requested


def _kv_error(prompt_len: int, requested: int, cap: int | None) -> APIError:
    return APIError(
        400,
        f"prompt ({prompt_len} tokens) + max_tokens ({requested}) needs more KV cache "
        f"than this server holds ({cap} tokens); lower max_tokens",
        param="max_tokens",
        code="kv_cache_too_small",
    )


def _context_error(server: ServingContext, prompt_len: int, requested: int) -> APIError:
    return APIError(
        400,
        f"This model's maximum context length is {server.max_context} tokens. However, you "
        f"requested {prompt_len + requested} tokens ({prompt_len} in the prompt, "
        f"{requested} for the completion). Please reduce the prompt or max_tokens.",
        param="max_tokens",
        code="context_length_exceeded",
    )


@dataclass(frozen=True)
class Constraint:
    """What a request's output must follow: a JSON schema or a Lark grammar (or nothing)."""

    json_schema: dict[str, Any] | None = None
    grammar: str | None = None


def response_schema(req: Any) -> dict[str, Any] | None:
    """``response_format`` as the JSON schema the output must follow (None: free text)."""
    if req.response_format is None:
        return None
    try:
        return req.response_format.schema_or_none()
    except ValueError as exc:
        raise APIError(400, str(exc), param="response_format") from None


def sampling(
    server: ServingContext,
    req: Any,
    max_tokens: int,
    logprobs: int | None,
    index: int,
    constraint: Constraint = Constraint(),
    prompt_logprobs: int | None = None,
) -> SamplingConfig:
    """Choice ``index``'s :class:`SamplingConfig`: the request's values, else the model's
    generation defaults, else OpenAI's; ``seed + index`` so choices differ reproducibly.
    The plan checks the constraint once (:func:`check_constraint`)."""
    d = server.gen_defaults
    temperature = req.temperature if req.temperature is not None else d.get("temperature", 1.0)
    top_k = req.top_k if req.top_k is not None else d.get("top_k", 0)
    bias = None
    if req.logit_bias:
        bias = {int(k): float(v) for k, v in req.logit_bias.items()}
        check_vocab(server, bias, "logit_bias has token id", "logit_bias")
    try:
        config = SamplingConfig(
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
            prompt_logprobs=prompt_logprobs,
            json_schema=constraint.json_schema,
            grammar=constraint.grammar,
        )
    except (ValueError, ConfigError) as exc:
        raise _config_error(str(exc)) from None
    return config


# SamplingConfig's names for the request fields they come from
_REQUEST_NAMES = {
    "min_new_tokens": "min_tokens", "max_new_tokens": "max_tokens",
    "json_schema": "response_format",
}  # fmt: skip


def _config_error(message: str) -> APIError:
    """A 400 for a SamplingConfig's complaint, in the request's own names; ``param`` the
    first field the message names."""
    named = sorted((message.index(k), k) for k in _REQUEST_NAMES if k in message)
    for _, name in named:
        message = message.replace(name, _REQUEST_NAMES[name])
    return APIError(400, message, param=_REQUEST_NAMES[named[0][1]] if named else None)


def check_constraint(server: ServingContext, configs: Sequence[SamplingConfig]) -> None:
    """A 400 when the plan's constrained output cannot be served: speculative decoding, or
    a schema / grammar the grammar engine rejects (checked once: every choice of a request
    carries the same constraint)."""
    config = configs[0]
    if not config.constrained:
        return
    param = "response_format" if config.json_schema is not None else "tool_choice"
    if server.speculative:
        raise APIError(
            400,
            "response_format / tool_choice constraints are not supported with speculative "
            "decoding; use a server started without --spec-config",
            param=param,
        )
    try:
        server.grammar.check(config)
    except (ValueError, ConfigError) as exc:
        raise APIError(400, str(exc), param=param) from None
