"""Tiny random-weight target / draft Llama pairs sharing a vocabulary (nothing downloaded)."""

from __future__ import annotations

import pytest
import torch
from support.spec_fixtures import (  # noqa: F401  (fixtures)
    draft_dir,
    pard_dir,
    self_pard_dir,
    target_dir,
    word_tokenizer,
)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
