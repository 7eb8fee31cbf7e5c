"""A checkpoint whose tensors do not have the shapes its config implies is refused at load,
naming the file and the tensors (a short norm weight loaded silently and generated garbage
from the fused kernels; a swapped or cut matrix failed deep in a kernel)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from pace_core import LLMModel
from pace_core.errors import ModelLoadError

NORM = "model.layers.0.input_layernorm.weight"
UP = "model.layers.1.mlp.up_proj.weight"


def edited(src: Path, out: Path, edit) -> Path:
    """A copy of the checkpoint ``src`` with ``edit`` applied to its tensors."""
    shutil.copytree(src, out)
    (file,) = out.glob("*.safetensors")
    tensors = load_file(file)
    edit(tensors)
    save_file(tensors, file, metadata={"format": "pt"})
    return out


def _set(name: str, make):
    return lambda t: t.update({name: make(t[name])})


CASES = {  # name: (edit, what the error says)
    "short norm": (_set(NORM, lambda w: w[:32].clone()), f"{NORM} is [32], expected [64]"),
    "swapped matrix": (
        _set(UP, lambda w: w.t().contiguous()),
        f"{UP} is [64, 128], expected [128, 64]",
    ),
    "cut rows": (_set(UP, lambda w: w[:100].clone()), f"{UP} is [100, 64], expected [128, 64]"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_safetensors_of_the_wrong_shape_are_named(tiny_llama_dir, tmp_path, case):
    edit, named = CASES[case]
    bad = edited(tiny_llama_dir, tmp_path / "bad", edit)
    with pytest.raises(ModelLoadError, match=r"1 tensor\(s\) do not have the shape") as exc:
        LLMModel(str(bad), dtype=torch.float32, load_tokenizer=False, quiet=True)
    assert named in str(exc.value) and str(bad) in str(exc.value)


@pytest.mark.parametrize("files", [1, 3])
def test_a_pytorch_bin_of_the_wrong_shape_is_named(tiny_llama_dir, tmp_path, files):
    """``pytorch_model.bin`` checkpoints (one file or an indexed set) are memory-mapped: their
    shapes are checked before anything is read."""
    from support.bin_checkpoints import write_bin_shards

    edit, named = CASES["swapped matrix"]
    state = load_file(tiny_llama_dir / "model.safetensors")
    edit(state)
    bad = tmp_path / "bad"
    bad.mkdir()
    shutil.copy(tiny_llama_dir / "config.json", bad)
    if files == 1:
        torch.save(state, bad / "pytorch_model.bin")
    else:
        write_bin_shards(state, bad, files)
    with pytest.raises(ModelLoadError, match=r"1 tensor\(s\) do not have the shape") as exc:
        LLMModel(str(bad), dtype=torch.float32, load_tokenizer=False, quiet=True)
    assert named in str(exc.value)


def test_a_gguf_with_a_short_norm_is_named(tiny_llama_dir, tmp_path):
    pytest.importorskip("gguf")
    from support.tiny_gguf import write_gguf

    edit, named = CASES["short norm"]
    bad = write_gguf(edited(tiny_llama_dir, tmp_path / "bad", edit), tmp_path / "bad.gguf", "q8_0")
    with pytest.raises(ModelLoadError, match="bad.gguf: 1 tensor") as exc:
        LLMModel(str(bad), dtype=torch.float32, load_tokenizer=False, quiet=True)
    assert named in str(exc.value)


def test_several_mismatches_are_counted_and_the_first_named(tiny_llama_dir, tmp_path):
    def halve_norms(t: dict) -> None:
        for name in [n for n in t if n.endswith("layernorm.weight")]:
            t[name] = t[name][:32].clone()

    bad = edited(tiny_llama_dir, tmp_path / "bad", halve_norms)
    with pytest.raises(ModelLoadError, match=r"4 tensor\(s\) do not have .* expected \[64\]"):
        LLMModel(str(bad), dtype=torch.float32, load_tokenizer=False, quiet=True)


def _unchecked(shapes: dict, config) -> list[str]:
    """The names of ``shapes`` the check does not know (for a checkpoint as made: none)."""
    from pace_core.models.shape_check import expected_shape

    expected = expected_shape(config)
    return [n for n in shapes if expected(n) is None]


def _first_layer_tensor(names: list[str], suffix: str) -> str:
    return next(n for n in sorted(names) if n.endswith(suffix) and ".0." in n)


# Per checked family: a tiny checkpoint (tests/support/tiny.py) and a layer tensor to cut.
FAMILY_CASES = {
    "phi3-partial-sliding": "qkv_proj.weight",
    "opt-postnorm-project": "fc1.weight",
    "gptj": "mlp.fc_in.weight",
    "gemma3": "q_norm.weight",
    "qwen3-moe": "experts.0.up_proj.weight",
    "deepseek-v3": "kv_b_proj.weight",
    "deepseek-v3-q-proj": "self_attn.q_proj.weight",
    "gpt-oss": "mlp.experts.gate_up_proj",
    "llama4": "feed_forward.gate_proj.weight",
    "gemma4": "self_attn.k_proj.weight",
    "gemma4-dense": "mlp.up_proj.weight",
}


@pytest.mark.parametrize("variant", list(FAMILY_CASES))
def test_each_checked_family_passes_as_made_and_names_a_cut_tensor(tmp_path, variant):
    """Every tensor of the family's checkpoint as transformers saved it has the shape the
    check expects (no false alarm: the check knows each name it checks); one cut is named."""
    from support.tiny import FACTORIES

    from pace_core.models.loader import load_config, load_weights

    good = FACTORIES[variant](tmp_path / "good")
    config = load_config(good)
    weights = load_weights(good, config)  # no error
    shapes = weights.shapes()
    assert _unchecked(shapes, config) == []  # every tensor is checked
    name = _first_layer_tensor(list(shapes), FAMILY_CASES[variant])
    bad = edited(good, tmp_path / "bad", _set(name, lambda w: w[:-1].clone()))
    with pytest.raises(ModelLoadError, match=r"1 tensor\(s\) do not have the shape") as exc:
        load_weights(bad, config)
    assert name in str(exc.value)


def _original_opt(t: dict) -> None:
    """OPTForCausalLM's names as the original facebook/opt files have them: ``decoder.*``."""
    for name in list(t):
        if name.startswith("model.decoder."):
            t[name.removeprefix("model.")] = t.pop(name)


def _fused_experts(t: dict) -> None:
    """Per-expert Qwen3-MoE tensors as one fused pair per layer: [E, 2I, H] and [E, H, I]."""
    for layer in sorted({n.split(".mlp.experts.")[0] for n in t if ".mlp.experts." in n}):
        experts = f"{layer}.mlp.experts"
        ids = sorted({int(n.split(".")[5]) for n in t if n.startswith(f"{experts}.")})
        part = {
            p: [t.pop(f"{experts}.{i}.{p}_proj.weight") for i in ids]
            for p in ("gate", "up", "down")
        }
        t[f"{experts}.gate_up_proj"] = torch.stack(
            [torch.cat([g, u]) for g, u in zip(part["gate"], part["up"], strict=True)]
        )
        t[f"{experts}.down_proj"] = torch.stack(part["down"])


def _mxfp4_experts(t: dict) -> None:
    """GPT-OSS experts as its released checkpoints store them: MXFP4 ``_blocks`` [E, R, K/32,
    16] and ``_scales`` [E, R, K/32] of the transposed matrices (R rows of K)."""
    for name in [n for n in t if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        e, k, rows = t.pop(name).shape  # dense [E, K, R]
        t[f"{name}_blocks"] = torch.zeros(e, rows, k // 32, 16, dtype=torch.uint8)
        t[f"{name}_scales"] = torch.full((e, rows, k // 32), 127, dtype=torch.uint8)


def _gemma4_per_expert(t: dict) -> None:
    """Gemma 4's fused experts ``[E, 2I, H]`` / ``[E, H, I]`` as one gated MLP per expert."""
    for fused in [n for n in t if n.endswith("experts.gate_up_proj")]:
        experts = fused.removesuffix(".gate_up_proj")
        gate_up, down = t.pop(fused), t.pop(f"{experts}.down_proj")
        for i, (pair, d) in enumerate(zip(gate_up, down, strict=True)):
            gate, up = pair.chunk(2)
            t |= {f"{experts}.{i}.gate_proj.weight": gate.clone(),
                  f"{experts}.{i}.up_proj.weight": up.clone(),
                  f"{experts}.{i}.down_proj.weight": d.clone()}  # fmt: skip


LAYOUT_CASES = {  # variant, layout edit, a tensor of the edited checkpoint to cut
    "original opt names": ("opt-prenorm", _original_opt, "decoder.layers.0.fc1.weight"),
    "fused experts": ("qwen3-moe", _fused_experts, "model.layers.0.mlp.experts.down_proj"),
    "mxfp4 experts": ("gpt-oss", _mxfp4_experts, "model.layers.0.mlp.experts.down_proj_blocks"),
    "per-expert gemma4": ("gemma4", _gemma4_per_expert, "model.layers.0.experts.1.up_proj.weight"),
}


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_other_layouts_of_a_family_are_checked_too(tmp_path, case):
    from support.tiny import FACTORIES

    from pace_core.models.loader import load_config, load_weights

    variant, layout, cut = LAYOUT_CASES[case]
    made = FACTORIES[variant](tmp_path / "made")
    config = load_config(made)
    good = edited(made, tmp_path / "good", layout)
    shapes = load_weights(good, config).shapes()  # no error
    assert cut in shapes and _unchecked(shapes, config) == []
    bad = edited(good, tmp_path / "bad", _set(cut, lambda w: w[:, :-1].clone()))
    with pytest.raises(ModelLoadError, match=r"1 tensor\(s\) do not have the shape") as exc:
        load_weights(bad, config)
    assert cut in str(exc.value)


OTHER_TOWERS = ("vision_tower", "vision_model", "multi_modal_projector", "embed_vision")
NEW_MULTIMODAL_NAMES = (
    ("language_model.model.", "model.language_model."),
    ("language_model.lm_head.", "lm_head."),
    ("vision_tower.", "model.vision_tower."),
    ("multi_modal_projector.", "model.multi_modal_projector."),
)


def _new_multimodal_names(t: dict) -> None:
    """The layout transformers builds multimodal models in (``model.language_model.*``,
    ``model.vision_tower.*``) from the saved ``language_model.model.*``, with an untied LM
    head at the top (``lm_head.weight``, the embedding's shape)."""
    for name in list(t):
        for old, new in NEW_MULTIMODAL_NAMES:
            if name.startswith(old):
                t[new + name.removeprefix(old)] = t.pop(name)
                break
    t.setdefault("lm_head.weight", t["model.language_model.embed_tokens.weight"].clone())


MULTIMODAL_CASES = {  # family, layout: the factory's name, a text tensor to cut, its length
    ("gemma3", "saved"): ("gemma3_conditional", "q_norm.weight", 32),
    ("gemma3", "new names"): ("gemma3_conditional", "lm_head.weight", 160),
    ("gemma4", "saved"): ("gemma4_conditional", "mlp.up_proj.weight", 96),
    ("llama4", "saved"): ("llama4_conditional", "feed_forward.down_proj.weight", 64),
}


@pytest.mark.parametrize("case", list(MULTIMODAL_CASES), ids="-".join)
def test_a_multimodal_checkpoints_text_part_is_checked(tmp_path, case):
    """ForConditionalGeneration: every tensor of the text model is checked against
    ``text_config`` (under its wrapper's names), the vision tower and projector are not."""
    from support import tiny

    from pace_core.models.loader import load_config, load_weights

    (family, layout), (factory, cut, rows) = case, MULTIMODAL_CASES[case]
    good = getattr(tiny, factory)(tmp_path / "made")
    if layout == "new names":
        good = edited(good, tmp_path / "good", _new_multimodal_names)
    config = load_config(good)
    shapes = load_weights(good, config).shapes()  # no error
    towers = [n for n in shapes if n.removeprefix("model.").split(".")[0] in OTHER_TOWERS]
    text = [n for n in shapes if n not in towers]
    assert towers and text
    assert all("language_model." in n or n.startswith("lm_head.") for n in text)
    assert _unchecked({n: shapes[n] for n in text}, config) == []
    assert _unchecked({n: shapes[n] for n in towers}, config) == towers
    name = cut if cut in shapes else _first_layer_tensor(text, cut)
    bad = edited(good, tmp_path / "bad", _set(name, lambda w: w[:-1].clone()))
    with pytest.raises(ModelLoadError, match=rf"\({family}\) implies") as exc:
        load_weights(bad, config)
    assert f"{name} is [{rows - 1}" in str(exc.value)


def test_gemma4_layers_are_checked_at_their_own_widths(tmp_path):
    """Gemma 4's layers differ in width: a global layer's query projection or a KV-sharing
    layer's double-wide MLP given the first (sliding) layer's shape is named with its own."""
    from support.tiny import FACTORIES

    from pace_core.models.loader import load_config, load_weights

    good = FACTORIES["gemma4"](tmp_path / "good")
    narrowed = {"model.layers.2.self_attn.q_proj.weight": "[64, 64], expected [128, 64]",
                "model.layers.4.mlp.up_proj.weight": "[96, 64], expected [192, 64]"}  # fmt: skip

    def as_layer_0(t: dict) -> None:
        for name in narrowed:
            t[name] = t[name.replace(".2.", ".0.").replace(".4.", ".0.")].clone()

    bad = edited(good, tmp_path / "bad", as_layer_0)
    with pytest.raises(ModelLoadError, match=r"2 tensor\(s\) do not have the shape") as exc:
        load_weights(bad, load_config(bad))
    for name, shapes in narrowed.items():
        assert f"{name} is {shapes}" in str(exc.value)


@pytest.mark.parametrize("quantization", ["int8", "int4"])  # int4 stores [N, K / 2] bytes
def test_biased_llama_attention_and_quantized_copies_are_checked(tmp_path, quantization):
    """A Llama with ``attention_bias`` (every projection biased, the output one too) passes
    as transformers saved it; in pace's quantized copy (``pace quantize``) the quantized
    matrices are checked at their logical shapes, as the file's metadata states them."""
    import json

    import transformers as tf
    from support.tiny import DIMS, NO_SPECIAL, save

    from pace_core.models.loader import load_config, load_weights
    from pace_core.models.quantized_copy import save_quantized

    good = save(tf.LlamaForCausalLM, tf.LlamaConfig(**DIMS, **NO_SPECIAL, attention_bias=True),
                tmp_path / "biased")  # fmt: skip
    shapes = load_weights(good, load_config(good)).shapes()
    assert "model.layers.0.self_attn.o_proj.bias" in shapes
    assert _unchecked(shapes, load_config(good)) == []

    copy = save_quantized(good, tmp_path / quantization, quantization)
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "intermediate_size": 100}))
    with pytest.raises(ModelLoadError, match=r"do not have the shape") as exc:
        load_weights(copy, load_config(copy))
    assert "model.layers.0.mlp.up_proj.weight is [128, 64], expected [100, 64]" in str(exc.value)
