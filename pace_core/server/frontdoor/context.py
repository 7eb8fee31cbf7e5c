"""What the OpenAI translation and delivery read of a server: :class:`ServingContext`, a
protocol (so :mod:`openai_request`, :mod:`openai_response` and :mod:`delivery` never import
the :class:`~pace_core.server.frontdoor.server.Server` that imports them), with the
front-door settings
(:class:`ServerConfig`) and the token text cache (:class:`TokenText`) it carries."""

from __future__ import annotations

from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any, Protocol

from pace_core.models.embedding import EmbeddingConfig
from pace_core.models.token_bytes import TokenBytes
from pace_core.sampling.grammar import GrammarCompiler
from pace_core.server.frontdoor.frontend import Frontend


@dataclass
class ServerConfig:
    """Front-door settings (the scheduler's are in :class:`EngineConfig`)."""

    served_model_name: str = "smollm2"
    aliases: tuple[str, ...] = ()
    api_key: str | None = None
    max_request_bytes: int = 4 << 20
    request_timeout: float | None = 600.0
    default_max_tokens: int = 1024  # chat requests without max_tokens (see docs/server.md)
    ui: bool = True  # the chat page at / (pace_core.server.ui)


class TokenText:
    """Token id -> display string and bytes (for logprobs), cached. A token holding part of
    a multi-byte character is displayed as its bytes, ``bytes:\\xe7\\x8c`` (OpenAI's
    convention), so distinct ones do not all read U+FFFD."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._bytes = TokenBytes(tokenizer)
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def get(self, token: int) -> tuple[str, list[int]]:
        found = self._cache.get(token)
        if found is None:
            text = self.tokenizer.decode([token])
            data = self._bytes(token, text)
            if "\ufffd" in text:
                try:
                    data.decode("utf-8")
                except UnicodeDecodeError:  # part of a character
                    text = "bytes:" + "".join(f"\\x{b:02x}" for b in data)
            found = self._cache[token] = (text, list(data))
        return found


class ServingContext(Protocol):
    """The parts of a :class:`~pace_core.server.frontdoor.server.Server` a request's
    translation uses."""

    tokenizer: Any  # used on ``text_worker`` only (a Rust tokenizer is not shareable)
    text_worker: Executor  # one thread: tokenization, chat templates, grammar checks
    config: ServerConfig
    frontend: Frontend
    max_context: int
    vocab_size: int
    gen_defaults: dict[str, Any]
    speculative: bool
    token_text: TokenText
    grammar: GrammarCompiler  # validates response_format / tool_choice constraints
    embedding: EmbeddingConfig | str  # the model's embedding rules, or why it cannot embed
    created: int  # unix time the server started (model cards)

    @property
    def model_names(self) -> tuple[str, ...]: ...
