"""Turn what users pass to ``generate`` into a list of unpadded 1-D prompt tensors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from pace_core.errors import ConfigError
from pace_core.values import is_int


def _is_chat(obj: Any) -> bool:
    return (
        isinstance(obj, Sequence)
        and bool(obj)
        and all(isinstance(m, Mapping) and "role" in m for m in obj)
    )


def _encode(tokenizer: Any, text: str) -> torch.Tensor:
    return torch.tensor(tokenizer(text, add_special_tokens=True)["input_ids"], dtype=torch.long)


def _chat(tokenizer: Any, messages: Sequence[Mapping[str, Any]]) -> torch.Tensor:
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError("chat messages were given but the tokenizer has no chat template")
    try:
        ids = tokenizer.apply_chat_template(
            list(messages), add_generation_prompt=True, tokenize=True
        )
    except Exception as exc:  # jinja's raise_exception, a message without content, ...
        raise ConfigError(
            f"the chat template cannot render these messages ({type(exc).__name__}: {exc}); "
            "give each a 'role' and a 'content' string"
        ) from None
    if isinstance(ids, Mapping):
        ids = ids["input_ids"]
    return torch.tensor(list(ids), dtype=torch.long)


def normalize_inputs(
    inputs: Any, tokenizer: Any | None
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """Prompts as 1-D tensors plus the caller's padded ``input_ids`` when one was given.

    Accepts a BatchEncoding/dict (``input_ids`` + ``attention_mask``), a ``[T]`` or ``[B, T]``
    tensor, a string, a list of strings, one chat (list of role/content dicts) or a list of chats.
    """

    def need_tokenizer() -> Any:
        if tokenizer is None:
            raise ConfigError("text inputs need a tokenizer; pass token ids or load one")
        return tokenizer

    if isinstance(inputs, Mapping) or hasattr(inputs, "input_ids"):
        if "input_ids" not in inputs:
            raise ConfigError(f"a mapping input needs input_ids (got keys {sorted(inputs)})")
        try:
            ids = torch.as_tensor(_token_ids(inputs["input_ids"]), dtype=torch.long)
        except ValueError:  # ragged rows
            raise ConfigError(
                "input_ids rows differ in length: pad them (tokenizer(texts, padding=True)) "
                "or pass a list of prompts"
            ) from None
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
        mask = (
            torch.ones_like(ids, dtype=torch.bool) if mask is None else torch.as_tensor(mask).bool()
        )
        if mask.shape != ids.shape:
            raise ConfigError(
                f"attention_mask shape {tuple(mask.shape)} != input_ids {tuple(ids.shape)}"
            )
        return [row[m] for row, m in zip(ids, mask)], ids
    if isinstance(inputs, torch.Tensor):
        ids = _token_ids(inputs).long()
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        if ids.dim() != 2:
            raise ConfigError(
                f"token tensor must be [T] or [B, T] (got shape {tuple(inputs.shape)})"
            )
        return list(ids), ids
    if isinstance(inputs, str):
        return [_encode(need_tokenizer(), inputs)], None
    if _is_chat(inputs):
        return [_chat(need_tokenizer(), inputs)], None
    if isinstance(inputs, bytes | bytearray):
        raise ConfigError("bytes are not a prompt: decode them to a str (or pass token ids)")
    if isinstance(inputs, Sequence) and inputs and all(is_int(t) for t in inputs):
        ids = torch.tensor(list(inputs), dtype=torch.long)  # one prompt's token ids
        return [ids], ids.unsqueeze(0)
    if isinstance(inputs, Sequence) and inputs:
        prompts = []
        for item in inputs:
            if isinstance(item, str):
                prompts.append(_encode(need_tokenizer(), item))
            elif _is_chat(item):
                prompts.append(_chat(need_tokenizer(), item))
            elif isinstance(item, torch.Tensor) and item.dim() == 1:
                prompts.append(_token_ids(item).long())
            elif isinstance(item, Sequence) and all(is_int(t) for t in item):
                prompts.append(torch.tensor(list(item), dtype=torch.long))
            elif isinstance(item, Mapping):
                raise ConfigError(
                    f"a chat message needs a 'role' and a 'content' (got keys {list(item)})"
                )
            else:
                raise ConfigError(f"unsupported prompt item of type {type(item).__name__}")
        return prompts, None
    raise ConfigError(
        f"unsupported generate() input of type {type(inputs).__name__}: pass a string, a list of "
        "strings, chat messages, token tensors or a tokenizer BatchEncoding"
    )


def _token_ids(ids: Any) -> Any:
    """``ids`` unchanged, unless a tensor of a non-integer dtype (a ``ConfigError``: float or
    bool ids would be truncated or read as 0 / 1)."""
    if not isinstance(ids, torch.Tensor):
        return ids
    if ids.dtype.is_floating_point or ids.dtype.is_complex or ids.dtype == torch.bool:
        raise ConfigError(f"token ids must be an integer tensor, not {ids.dtype}")
    return ids


def checked_prompts(
    inputs: Any,
    tokenizer: Any | None,
    vocab_size: int,
    max_context: int | None,
    *,
    generating: bool = True,
) -> tuple[list[torch.Tensor], torch.Tensor | None]:
    """:func:`normalize_inputs`, each prompt checked non-empty, in the vocabulary and within
    the context window: shorter than it when ``generating`` (a new token needs a position),
    at most as long otherwise (an embedding). ``ConfigError`` naming the prompt."""
    prompts, padded = normalize_inputs(inputs, tokenizer)
    if not prompts:
        raise ConfigError("no prompts were given (an empty batch)")
    for i, p in enumerate(prompts):
        if p.numel() == 0:
            raise ConfigError(f"prompt {i} is empty: every prompt needs at least one token")
        bad = p[(p < 0) | (p >= vocab_size)]
        if bad.numel():
            raise ConfigError(
                f"prompt {i} has token id {int(bad[0])} outside the vocabulary [0, {vocab_size})"
            )
        if max_context and p.numel() > max_context - generating:
            room = " (one position is left for the first new token)" if generating else ""
            raise ConfigError(
                f"prompt {i} has {p.numel()} tokens; the model's context window is "
                f"{max_context}{room}"
            )
    return prompts, padded
