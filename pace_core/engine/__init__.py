"""The offline engine: LLMModel, the generation loop and its outputs."""
