"""The speculative set-up of a target: the validated config, the target and draft decoders
(loaded by the caller) and a factory of proposers. It never loads or imports ``LLMModel``:
``LLMModel`` loads the draft and hands both models over as :class:`SpecModel`."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pace_core.errors import ConfigError
from pace_core.models.decoder import DecoderLM
from pace_core.speculative.config import (
    DraftSpecDecodeConfig,
    PardSpecDecodeConfig,
    PromptLookupConfig,
    SpecConfig,
)
from pace_core.speculative.draft import DraftModelProposer
from pace_core.speculative.inferencer import ModelInferencer
from pace_core.speculative.ngram import PromptLookupProposer
from pace_core.speculative.pard import PardProposer, resolve_pard_token
from pace_core.speculative.proposer import Proposer
from pace_core.speculative.stats import SpecStats

__all__ = ["SpecModel", "Speculator", "check_vocab_compatible", "load_draft_tokenizer"]

log = logging.getLogger("pace.speculative")


@dataclass(frozen=True)
class SpecModel:
    """A loaded model as speculative decoding uses it: the decoder, a factory of its empty KV
    caches (type and budget; keyword options override the budget), its tokenizer (None when
    unknown) and a name for messages."""

    model: DecoderLM
    new_cache: Callable[..., Any]
    tokenizer: Any | None = None
    name: str = "model"


def check_vocab_compatible(
    target_vocab: int,
    draft_vocab: int,
    target_tokenizer: Any | None = None,
    draft_tokenizer: Any | None = None,
    where: str = "draft",
) -> None:
    """The draft must score every target token id, with the same meaning.

    Its logits may be wider (extra tokens such as a PARD mask are never proposed). When both
    tokenizers are known, every target token string must map to the same id in the draft.
    """
    if draft_vocab < target_vocab:
        raise ConfigError(
            f"{where}: vocab mismatch: the draft scores {draft_vocab} tokens but the target has "
            f"{target_vocab}; speculative decoding needs a draft sharing the target's vocabulary"
        )
    if target_tokenizer is None or draft_tokenizer is None:
        return
    tv, dv = target_tokenizer.get_vocab(), draft_tokenizer.get_vocab()
    bad = [tok for tok, i in tv.items() if i < target_vocab and dv.get(tok) != i]
    if bad:
        sample = ", ".join(f"{t!r}: {tv[t]} vs {dv.get(t)}" for t in bad[:3])
        raise ConfigError(
            f"{where}: vocab mismatch: {len(bad)} target tokens have another id in the draft's "
            f"tokenizer (e.g. {sample}); use a draft from the same tokenizer family"
        )


def load_draft_tokenizer(path: Path) -> Any | None:
    """The tokenizer next to a draft checkpoint, or None (then only widths are checked)."""
    if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from pace_core.models.loader import load_tokenizer

    try:
        return load_tokenizer(path)
    except Exception as exc:  # a draft without a usable tokenizer: width check only
        log.warning("cannot load the draft tokenizer of %s (%s); checking widths only", path, exc)
        return None


class Speculator:
    """A target's speculative decoding set-up: its config, the draft model and a factory of
    proposers (the engine core runs the steps).

    Args:
        config: the validated spec config.
        target: the target model.
        draft: the draft model (None for prompt lookup, required otherwise).

    Attributes:
        draft: the draft :class:`SpecModel` (None for prompt lookup).
        stats: counters summed over every batch since the model was loaded.
    """

    def __init__(self, config: SpecConfig, target: SpecModel, draft: SpecModel | None = None):
        self.config = config
        self.target = ModelInferencer(target.model, target.new_cache)
        self.draft = draft
        self.stats = SpecStats()
        self._mask_token: int | None = None
        if target.model.reprefill_at is not None:
            raise ConfigError(
                "speculative decoding does not support LongRoPE models (their keys are "
                "recomputed when a sequence crosses the original context length)"
            )
        if isinstance(config, PromptLookupConfig):
            return
        if draft is None:
            raise ConfigError(f"speculative method {config.method!r} needs a draft model")
        if draft.model.reprefill_at is not None:
            raise ConfigError(f"draft {draft.name}: LongRoPE draft models are not supported")
        target_vocab = target.model.vocab_size
        check_vocab_compatible(
            target_vocab, draft.model.vocab_size, target.tokenizer, draft.tokenizer, draft.name
        )
        if isinstance(config, PardSpecDecodeConfig):
            rows = int(getattr(draft.model.config, "vocab_size", draft.model.vocab_size))
            self._mask_token = resolve_pard_token(
                draft.model.config, config.pard_token, rows, draft.name
            )
        self._draft_inferencer = ModelInferencer(
            draft.model, draft.new_cache, logits_width=target_vocab
        )

    @property
    def num_speculative_tokens(self) -> int:
        return self.config.num_speculative_tokens

    def new_proposer(self, cache: Any | None = None) -> Proposer:
        """A fresh proposer for one batch.

        ``cache``: an empty KV cache of the draft for the proposer's rows (a server sizes it
        like its target pool); default a new one of the draft's own ``kv_cache_type`` and
        budget. Ignored by prompt lookup.
        """
        if isinstance(self.config, PromptLookupConfig):
            return PromptLookupProposer(self.config)
        if isinstance(self.config, PardSpecDecodeConfig):
            assert self._mask_token is not None
            return PardProposer(self._draft_inferencer, self._mask_token, cache=cache)
        assert isinstance(self.config, DraftSpecDecodeConfig)
        return DraftModelProposer(self._draft_inferencer, cache=cache)
