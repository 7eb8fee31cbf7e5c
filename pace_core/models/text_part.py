"""Where a multimodal ``*ForConditionalGeneration`` checkpoint keeps its text model."""

from __future__ import annotations

TEXT_PREFIXES = (
    ("model.language_model.", "model."),
    ("language_model.model.", "model."),
    ("language_model.lm_head.", "lm_head."),
)
"""The text model's prefixes in a multimodal checkpoint (the layout transformers builds, then
the one it saves) -> the text model's own names. The newer layout keeps ``lm_head.`` as is."""


def text_name(name: str) -> str | None:
    """A multimodal checkpoint's tensor name as the text model's (None: not under a text
    prefix: another tower's, or already the text model's own, like a top-level ``lm_head``)."""
    for old, new in TEXT_PREFIXES:
        if name.startswith(old):
            return new + name.removeprefix(old)
    return None
