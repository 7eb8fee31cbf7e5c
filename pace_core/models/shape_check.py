"""A checkpoint's tensor shapes against the ones its config implies, before anything is built.

The families read weights by name and trust their sizes; a tensor of the wrong shape (a broken
conversion, a config.json that belongs to another checkpoint) would otherwise be bound as is:
a raw shape error deep in a kernel, or, where a fused kernel takes the config's sizes, a model
that reads past its weights and generates garbage. transformers refuses such checkpoints when
it loads them; so does pace, comparing every tensor whose name transformers' model of the same
config has (built on the meta device: no memory) with that model's parameter shape.
"""

from __future__ import annotations

from typing import Any

import torch

from pace_core.errors import ModelLoadError
from pace_core.models.weights import WeightStore

SHOWN = 5  # mismatches named in the error


def expected_shapes(config: Any) -> dict[str, tuple[int, ...]]:
    """Parameter and buffer shapes of transformers' causal LM for ``config``; empty when
    transformers cannot build one (a config it does not know: nothing to compare with)."""
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception:  # no reference model (a config transformers cannot build): nothing to say
        return {}
    return {name: tuple(t.shape) for name, t in model.state_dict().items()}


def check_shapes(weights: WeightStore, config: Any) -> None:
    """ModelLoadError naming the tensors of ``weights`` whose shape differs from the one
    ``config`` implies (names transformers does not have are left to the builder's checks)."""
    stored = weights.shapes()
    if not stored:
        return
    expected = expected_shapes(config)
    bad = [
        (name, shape, expected[name])
        for name, shape in stored.items()
        if name in expected and expected[name] != shape
    ]
    if not bad:
        return
    shown = "; ".join(f"{n} is {list(s)}, expected {list(e)}" for n, s, e in bad[:SHOWN])
    more = f" (and {len(bad) - SHOWN} more)" if len(bad) > SHOWN else ""
    raise ModelLoadError(
        f"{weights.source}: {len(bad)} tensor(s) do not have the shape the model's config "
        f"({getattr(config, 'model_type', '?')}) implies: {shown}{more}. The file does not "
        "match its config: re-convert or re-download it, or use the config.json it was made with"
    )
