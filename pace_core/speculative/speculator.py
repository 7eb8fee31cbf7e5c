"""What ``LLMModel`` holds when it has a ``spec_config``: the loaded draft and a run factory."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pace_core.engine.generate import FinishFn
from pace_core.errors import ConfigError
from pace_core.sampling.sampler import BatchSampler
from pace_core.speculative.config import (
    DraftSpecDecodeConfig,
    PardSpecDecodeConfig,
    PromptLookupConfig,
    SpecConfig,
    coerce_spec_config,
)
from pace_core.speculative.draft import DraftModelProposer
from pace_core.speculative.inferencer import ModelInferencer
from pace_core.speculative.loop import SpeculativeRun
from pace_core.speculative.ngram import PromptLookupProposer
from pace_core.speculative.pard import PardProposer, resolve_pard_token
from pace_core.speculative.proposer import Proposer
from pace_core.speculative.stats import SpecStats

if TYPE_CHECKING:
    from pace_core.engine.llm import LLMModel

__all__ = ["Speculator", "build_speculator", "check_vocab_compatible"]

log = logging.getLogger("pace.speculative")


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


def _draft_tokenizer(path: Path) -> Any | None:
    if not any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(path))
    except Exception as exc:  # a draft without a usable tokenizer: width check only
        log.warning("cannot load the draft tokenizer of %s (%s); checking widths only", path, exc)
        return None


def _load_draft(target: LLMModel, source: Any) -> LLMModel:
    from pace_core.engine.llm import LLMModel

    if isinstance(source, LLMModel):
        return source
    return LLMModel(
        source,
        dtype=target.dtype,
        kv_cache_type=target.kv_cache_type,
        opconfig=target.opconfig,
        load_tokenizer=False,
        quiet=True,
        kv_cache_memory_gb=target.cache_options.get("memory_gb"),
        max_cache_tokens=target.cache_options.get("max_tokens"),
    )


class Speculator:
    """A target's speculative decoding set-up; :meth:`run` starts one batch.

    Attributes:
        config: the validated spec config.
        draft: the draft :class:`LLMModel` (None for prompt lookup).
        stats: counters summed over every batch since the model was loaded.
    """

    def __init__(self, target: LLMModel, config: SpecConfig) -> None:
        self.config = config
        self.target = ModelInferencer(target)
        self.draft: LLMModel | None = None
        self.stats = SpecStats()
        self._mask_token: int | None = None
        if target.model.reprefill_at is not None:
            raise ConfigError(
                "speculative decoding does not support LongRoPE models (their keys are "
                "recomputed when a sequence crosses the original context length)"
            )
        if isinstance(config, PromptLookupConfig):
            return
        self.draft = _load_draft(target, config.model_name_or_path)
        name = str(getattr(self.draft, "path", config.model_name_or_path))
        if self.draft.model.reprefill_at is not None:
            raise ConfigError(f"draft {name}: LongRoPE draft models are not supported")
        draft_tok = self.draft.tokenizer
        if draft_tok is None and target.tokenizer is not None and hasattr(self.draft, "path"):
            draft_tok = _draft_tokenizer(Path(self.draft.path))
        target_vocab = target.model.vocab_size
        check_vocab_compatible(
            target_vocab, self.draft.model.vocab_size, target.tokenizer, draft_tok, name
        )
        if isinstance(config, PardSpecDecodeConfig):
            rows = int(getattr(self.draft.model.config, "vocab_size", self.draft.model.vocab_size))
            self._mask_token = resolve_pard_token(
                self.draft.model.config, config.pard_token, rows, name
            )
        self._draft_inferencer = ModelInferencer(self.draft, logits_width=target_vocab)

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

    def run(
        self,
        prompts: Sequence[torch.Tensor],
        sampler: BatchSampler,
        finish: FinishFn,
        *,
        keep_logits: bool = False,
        on_round_end: Callable[[SpeculativeRun], None] | None = None,
    ) -> SpeculativeRun:
        """The event stream of one batch (see :class:`SpeculativeRun`)."""
        run = SpeculativeRun(
            self.target,
            self.new_proposer(),
            self.num_speculative_tokens,
            prompts,
            sampler,
            finish,
            keep_logits=keep_logits,
            on_round_end=on_round_end,
            on_done=self.stats.merge,
        )
        return run


def build_speculator(target: LLMModel, spec_config: Any) -> Speculator:
    """Validate ``spec_config`` (object or dict) and load what it needs."""
    return Speculator(target, coerce_spec_config(spec_config))
