"""Sharded ``pytorch_model.bin`` checkpoints (with their index) from a state dict."""

from __future__ import annotations

import json
from pathlib import Path

import torch


def write_bin_shards(state: dict, path: Path, shards: int) -> None:
    """``state`` as ``shards`` ``pytorch_model-*.bin`` files and their index."""
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        file = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = {n: state[n] for n in names[i::shards]}
        torch.save(part, path / file)
        weight_map.update(dict.fromkeys(part, file))
    (path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": weight_map}))
