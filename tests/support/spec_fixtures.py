"""Fixtures of tiny random-weight target / draft Llama pairs sharing a vocabulary (nothing
downloaded). Imported by ``tests/speculative/conftest.py`` and the speculative serving tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.spec_models import VOCAB, save_llama


@pytest.fixture(scope="session")
def target_dir(tmp_path_factory) -> Path:
    return save_llama(tmp_path_factory.mktemp("spec_target"))


@pytest.fixture(scope="session")
def draft_dir(tmp_path_factory) -> Path:
    return save_llama(tmp_path_factory.mktemp("spec_draft"), hidden=32, layers=1, seed=1)


@pytest.fixture(scope="session")
def pard_dir(tmp_path_factory) -> Path:
    """A PARD-style draft: one extra vocabulary entry, its id in config.pard_token."""
    return save_llama(
        tmp_path_factory.mktemp("spec_pard"),
        vocab=VOCAB + 1,
        hidden=32,
        layers=1,
        seed=2,
        pard_token=VOCAB,
    )


@pytest.fixture(scope="session")
def self_pard_dir(tmp_path_factory) -> Path:
    """The target's own weights as a PARD draft (mask token 7): its first draft is always
    right, the mask-position drafts usually wrong, so rows accept different lengths."""
    return save_llama(tmp_path_factory.mktemp("spec_self_pard"), pard_token=7)


@pytest.fixture(scope="session")
def word_tokenizer():
    """A word-level tokenizer ``w0 .. w127`` (decodes ids to space-separated words)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(models.WordLevel({f"w{i}": i for i in range(VOCAB)}, unk_token="w0"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tk)
