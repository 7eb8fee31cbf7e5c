"""Speculative decoding: draft tokens cheaply, verify them with one target forward.

    >>> llm = LLMModel("smollm2", spec_config=PromptLookupConfig(num_speculative_tokens=8))
    >>> out = llm.generate(prompt, SamplingConfig(max_new_tokens=64))
    >>> out.spec_stats.acceptance_rate

Proposers: PARD parallel drafts (:class:`PardSpecDecodeConfig`), a classic draft model
(:class:`DraftSpecDecodeConfig`) and n-gram prompt lookup (:class:`PromptLookupConfig`).
Greedy output equals plain greedy decoding token for token; sampling uses rejection sampling
and follows the target distribution. See ``docs/speculative.md``.
"""

from pace_core.speculative.config import (
    DraftSpecDecodeConfig,
    PardSpecDecodeConfig,
    PromptLookupConfig,
    SpecConfig,
    coerce_spec_config,
)
from pace_core.speculative.draft import DraftModelProposer
from pace_core.speculative.inferencer import KVRows, ModelInferencer
from pace_core.speculative.ngram import PromptLookupProposer
from pace_core.speculative.pard import PardProposer
from pace_core.speculative.proposer import Proposal, Proposer, RowSampling
from pace_core.speculative.protocol import (
    DecodeOutput,
    Inferencer,
    PrefillOutput,
    SequenceKV,
    TokenSampler,
)
from pace_core.speculative.speculator import (
    SpecModel,
    Speculator,
    check_vocab_compatible,
    load_draft_tokenizer,
)
from pace_core.speculative.stats import SpecStats
from pace_core.speculative.verify import verify_row

__all__ = [
    "DecodeOutput",
    "DraftModelProposer",
    "DraftSpecDecodeConfig",
    "Inferencer",
    "KVRows",
    "ModelInferencer",
    "PardProposer",
    "PardSpecDecodeConfig",
    "PrefillOutput",
    "PromptLookupConfig",
    "PromptLookupProposer",
    "Proposal",
    "Proposer",
    "RowSampling",
    "SequenceKV",
    "SpecConfig",
    "SpecModel",
    "SpecStats",
    "Speculator",
    "TokenSampler",
    "check_vocab_compatible",
    "coerce_spec_config",
    "load_draft_tokenizer",
    "verify_row",
]
