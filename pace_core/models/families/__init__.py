"""One module per model family; each exposes ``build(builder) -> DecoderLM``."""
