"""The small endpoints: ``POST /tokenize``, ``POST /detokenize`` (vLLM's shapes) and the model
card of ``GET /v1/models`` / ``GET /v1/models/{id}``."""

from __future__ import annotations

from typing import Any

from pace_core.server.api.openai_request import chat_prompt, check_model, check_vocab
from pace_core.server.api.protocol import (
    APIError,
    ChatCompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)
from pace_core.server.api.tools import plan_tools
from pace_core.server.frontdoor.context import ServingContext


def model_card(server: ServingContext, name: str) -> dict[str, Any]:
    """One served model name as an OpenAI model object (404 for a name not served)."""
    check_model(server, name)
    return {
        "id": name,
        "object": "model",
        "created": server.created,
        "owned_by": "pace",
        "max_model_len": server.max_context,
    }


def tokenize(server: ServingContext, req: TokenizeRequest) -> dict[str, Any]:
    """The token ids of a prompt, or of chat messages rendered by the chat template (with
    tools, as ``/v1/chat/completions`` renders them)."""
    check_model(server, req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of prompt and messages", param="prompt")
    if req.prompt is not None:
        for field in ("tools", "add_generation_prompt"):
            if field in req.model_fields_set:
                raise APIError(
                    400, f"{field} applies to chat messages, not to a prompt", param=field
                )
        special = True if req.add_special_tokens is None else req.add_special_tokens
        ids = list(server.tokenizer(req.prompt, add_special_tokens=special)["input_ids"])
    else:
        if req.add_special_tokens:
            raise APIError(
                400,
                "add_special_tokens applies to prompts; the chat template adds the special "
                "tokens of messages",
                param="add_special_tokens",
            )
        chat = ChatCompletionRequest(
            messages=req.messages or [],
            tools=req.tools,
            add_generation_prompt=req.add_generation_prompt,
        )
        template = getattr(server.tokenizer, "chat_template", None)
        ids = chat_prompt(server, chat, plan_tools(chat, template))
    out: dict[str, Any] = {"count": len(ids), "max_model_len": server.max_context, "tokens": ids}
    if req.return_token_strs:
        out["token_strs"] = server.tokenizer.convert_ids_to_tokens(ids)
    return out


def detokenize(server: ServingContext, req: DetokenizeRequest) -> dict[str, Any]:
    """The text of token ids (special tokens kept, as vLLM does)."""
    check_model(server, req.model)
    check_vocab(server, req.tokens, "tokens has id", "tokens")
    return {"prompt": server.tokenizer.decode(req.tokens)}
