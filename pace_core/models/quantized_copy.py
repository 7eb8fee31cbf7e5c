"""A quantized copy of a checkpoint on disk: what ``pace models quantize`` writes.

The copy is an ordinary Hugging Face directory whose ``model.safetensors`` holds codes,
``_scales`` and ``_mins`` per matrix (described by ``pace_core.quant.checkpoint``) and whose
``config.json`` carries a ``quantization_config``; pace loads it without re-quantizing.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import torch

from pace_core.errors import ConfigError
from pace_core.models.text_part import text_name
from pace_core.quant.checkpoint import METADATA_KEY, WEIGHT_FILES, pack


def save_quantized(
    model: str | Path,
    out: str | Path,
    quantization: Any,
    dtype: torch.dtype | str = torch.bfloat16,
) -> Path:
    """Quantize the checkpoint ``model`` (a Hugging Face directory or zoo name) and write the
    copy to ``out``: what pace then loads without re-quantizing (and with ``dtype`` as the
    compute dtype the weights de-quantize to, unless the load asks otherwise)."""
    from safetensors.torch import save_file

    from pace_core.models.loader import build_model, load_config, parse_dtype, resolve_model_path
    from pace_core.models.weights import WeightStore
    from pace_core.opconfig import OperatorConfig
    from pace_core.plugins import get_host
    from pace_core.quant.config import coerce_quantization

    q = coerce_quantization(quantization)
    if q is None:
        raise ConfigError("save_quantized needs a quantization: 'int8', 'int4', ...")
    source, out = resolve_model_path(model), Path(out)
    if not source.is_dir():
        raise ConfigError(f"{source} is not a Hugging Face directory (a GGUF file?): not saved")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        same = out.resolve() == source.resolve()
        raise ConfigError(
            f"{out} is {'the source directory' if same else 'not an empty directory'}: write "
            "the quantized copy to a new or empty one"
        )
    config = json.loads((source / "config.json").read_text())
    if "quantization_config" in config:
        raise ConfigError(f"{source} is already a quantized checkpoint; start from the original")
    host = get_host()
    recorded: dict[str, Any] = {}
    hf_config = load_config(source)
    _refuse_experts(source, hf_config, q)
    resolver = host.resolver(OperatorConfig.coerce("default=native"))  # no packed copies
    build_model(source, hf_config, parse_dtype(dtype), host, resolver, quiet=True,
                quantization=q, record=recorded)  # fmt: skip
    experts = sorted(n for n in recorded if re.search(r"\.experts\.\d+\.", n))
    if experts:  # a family whose config names its experts otherwise
        raise ConfigError(_EXPERTS_NOT_SAVED.format(source=source, what=experts[0]))
    tensors, described = pack(recorded)
    recorded.clear()
    store = WeightStore.from_dir(source)
    tied = getattr(hf_config, "tie_word_embeddings", False)
    for name in store.names():  # the rest as stored (a multimodal wrapper's names kept)
        own = text_name(name) or name  # the name the model was built with
        if own in tensors or (tied and own == "lm_head.weight"):
            continue
        tensors[name] = store.take(name).contiguous()
    out.mkdir(parents=True, exist_ok=True)
    for item in source.iterdir():
        if item.is_file() and not any(item.match(p) for p in WEIGHT_FILES):
            shutil.copy2(item, out / item.name)
    save_file(tensors, str(out / "model.safetensors"), metadata={METADATA_KEY: described})
    config["quantization_config"] = q.to_json()
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


_EXPERTS_NOT_SAVED = (
    "{source} has MoE experts ({what}): quantized experts are not saved yet; load the original "
    "with quantization=... instead (quantize on load), or skip=['experts']"
)
_EXPERT_COUNTS = ("num_experts", "n_routed_experts", "num_local_experts")


def _refuse_experts(source: Path, hf_config: Any, q: Any) -> None:
    """Before any work: an MoE checkpoint whose experts would be quantized cannot be saved."""
    text = getattr(hf_config, "text_config", None) or hf_config
    counts = [getattr(text, name, None) for name in _EXPERT_COUNTS]
    if any(counts) and not q.skips("model.layers.0.mlp.experts"):
        raise ConfigError(_EXPERTS_NOT_SAVED.format(source=source, what="config: MoE"))
