"""Quantize-on-load: pace's int8/int4 formats, the config, and tiny models of every family
against transformers running the same de-quantized weights (fp32, logits within 1e-4)."""

from __future__ import annotations

import json

import pytest
import torch
from support.tiny import FACTORIES
from transformers import AutoModelForCausalLM

from pace_core import LLMModel
from pace_core.errors import ConfigError
from pace_core.quant import QuantizationConfig, QuantizedWeight, coerce_quantization, quantize

CONFIGS = {
    "int8": QuantizationConfig(bits=8),
    "int8-g32": QuantizationConfig(bits=8, group_size=32),
    "int4-g32": QuantizationConfig(bits=4, group_size=32),
    "int4-g32-asym": QuantizationConfig(bits=4, group_size=32, symmetric=False),
}
# every family of the tiny set but GPT-OSS (its MoE experts stay dense: no `moe` kernel takes
# quantized weights yet; its router is a linear and would be quantized)
FAMILIES = [name for name in FACTORIES if name != "gpt-oss"]
NATIVE = {"default": "native"}


def rand(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, k, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", list(CONFIGS))
def test_round_trip_error_is_within_half_a_step(name):
    cfg = CONFIGS[name]
    w = rand(48, 128)
    w[3] = 0.0  # an all-zero row: scale 0, no division by zero
    q = quantize(w, cfg)
    back = q.dequantize()
    assert back.shape == w.shape and back.dtype == w.dtype
    assert torch.equal(back[3], torch.zeros(128))
    group = cfg.group_size or 128
    step = q.scales.float().repeat_interleave(group, dim=1).abs()
    # symmetric int4 clips the side opposite the largest magnitude to 7 steps (as Q4_0 does)
    slack = 1.0 if name == "int4-g32" else 0.5
    assert bool(((back - w).abs() <= step * slack + 1e-6).all())
    assert q.nbytes < w.numel() * w.element_size() / (3 if cfg.bits == 8 else 6)


def test_rows_split_and_cat_agree_with_dequantize():
    q = quantize(rand(40, 64), CONFIGS["int4-g32-asym"])
    full = q.dequantize()
    idx = torch.tensor([5, 0, 39])
    assert torch.equal(q.dequantize(idx), full[idx])
    parts = q.split([8, 32])
    assert [p.shape for p in parts] == [(8, 64), (32, 64)]
    assert torch.equal(QuantizedWeight.cat(parts).dequantize(), full)
    with pytest.raises(ValueError, match="do not add up"):
        q.split([8, 8])
    other = quantize(rand(8, 64), CONFIGS["int8"])
    with pytest.raises(ValueError, match="cannot stack a int8"):
        QuantizedWeight.cat([q, other])


def test_config_errors_name_the_value_and_the_choices():
    with pytest.raises(ConfigError, match=r"unknown quantization 'int3'.*int8.*int4"):
        coerce_quantization("int3")
    with pytest.raises(ConfigError, match="bits=5"):
        QuantizationConfig(bits=5)
    with pytest.raises(ConfigError, match=r"group_size=0 unsupported for int4; use one of 32"):
        QuantizationConfig(bits=4, group_size=0)
    with pytest.raises(ConfigError, match="int8 is symmetric only"):
        QuantizationConfig(bits=8, symmetric=False)
    with pytest.raises(ConfigError, match=r"bad quantization fields.*bitz"):
        coerce_quantization({"bitz": 4})
    with pytest.raises(ConfigError, match=r"row length 48 is not a multiple of it"):
        quantize(rand(4, 48), CONFIGS["int4-g32"], name="model.layers.0.mlp.up_proj")
    assert coerce_quantization("INT4") == QuantizationConfig(bits=4, group_size=32, symmetric=False)
    assert coerce_quantization("none") is None


# MoE routers keep their format (pace_core.models.moe); so does MLA's kv_b_proj, absorbed into
# per-head query and output maps at load (pace_core.models.mla)
KEEP_FORMAT = (".router", ".router.proj", ".mlp.gate", ".kv_b_proj")


# transformers' fused expert tensors stored [E, in, out] (x @ W): pace quantizes each expert's
# [out, in] rows, so these are quantized transposed; the others are [E, out, in] already
EXPERTS_IN_OUT = ("llama4_text",)


def expert_tensors(hf: torch.nn.Module) -> list[torch.Tensor]:
    """The fused 3-D expert weights of every MoE layer, each viewed [E, out, in]."""
    transposed = hf.config.model_type in EXPERTS_IN_OUT
    return [
        p.transpose(1, 2) if transposed else p
        for name, p in hf.named_parameters()
        if p.dim() == 3 and name.endswith(("experts.gate_up_proj", "experts.down_proj"))
    ]


def fake_quantized(hf: torch.nn.Module, cfg: QuantizationConfig) -> None:
    """Replace every matrix pace quantizes (linear layers, each MoE expert's matrices; token
    embeddings and the head with the head's config; not position tables, not
    ``KEEP_FORMAT``) by its de-quantized values, in place."""
    head = hf.get_output_embeddings()
    with torch.no_grad():
        for experts in expert_tensors(hf):
            for matrix in experts:  # per row, so gate/up row order does not matter
                matrix.copy_(quantize(matrix.contiguous(), cfg).dequantize())
        for name, module in hf.named_modules():
            if not isinstance(module, torch.nn.Linear | torch.nn.Embedding):
                continue
            if "embed_positions" in name or name.endswith(KEEP_FORMAT) or cfg.skips(name):
                continue
            is_head = isinstance(module, torch.nn.Embedding) or module is head
            if module is head and module.weight is hf.get_input_embeddings().weight:
                continue  # a tied head: replaced with the embedding
            module.weight.copy_(quantize(module.weight, cfg.for_head() if is_head else cfg)
                                .dequantize())  # fmt: skip


def fits(path, cfg: QuantizationConfig) -> bool:
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    rows = [m.weight.shape[1] for m in hf.modules()
            if isinstance(m, torch.nn.Linear | torch.nn.Embedding)]  # fmt: skip
    rows += [experts.shape[2] for experts in expert_tensors(hf)]
    return all(n % (cfg.group_size or 1) == 0 for n in rows)


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    return {name: FACTORIES[name](tmp_path_factory.mktemp(name)) for name in FAMILIES}


@pytest.mark.parametrize("qname", ["int8", "int4-g32", "int4-g32-asym"])
@pytest.mark.parametrize("family", FAMILIES)
def test_family_matches_transformers_on_dequantized_weights(family_dirs, family, qname):
    cfg = CONFIGS[qname]
    path = family_dirs[family]
    if not fits(path, cfg):
        pytest.skip(f"{family} has rows not a multiple of {cfg.group_size}")
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    fake_quantized(hf, cfg)
    pace = LLMModel(path, dtype=torch.float32, load_tokenizer=False, quantization=cfg,
                    opconfig=NATIVE)  # the reference (pace-avx512's are tested against it)
    assert pace.model.plan.backends()["linear"] == {"native"}
    ids = torch.randint(
        3, hf.config.vocab_size, (1, 24), generator=torch.Generator().manual_seed(1)
    )
    with torch.no_grad():
        ref = hf(ids).logits
    got = pace.logits(ids)
    assert float((got - ref).abs().max()) < 1e-4


def test_weights_stay_quantized_and_the_tied_head_shares_the_embedding(family_dirs):
    pace = LLMModel(family_dirs["gemma3"], dtype=torch.float32, load_tokenizer=False,
                    quantization="int8", opconfig=NATIVE)  # fmt: skip
    table = pace.model.embed.weight
    assert isinstance(table, QuantizedWeight) and table.format == "int8"
    assert pace.model.lm_head.weight.weight is table  # one copy serves both roles
    # under auto: the backends with quantized kernels (native, avx512 on VNNI CPUs); every
    # better-ranked one passed over says why (the format, or this CPU)
    auto = LLMModel(family_dirs["gemma3"], dtype=torch.float32, load_tokenizer=False,
                    quantization="int8")  # fmt: skip
    ops = ("linear", "qkv_proj", "gated_mlp")
    sites = [r for r in auto.model.plan.resolutions if r.op in ops]
    assert sites and all(r.kernel.backend in ("native", "avx512") for r in sites)
    for r in sites:
        for _, reason in r.rejected:
            assert "weight format int8 unsupported (takes dense)" in reason or (
                "missing CPU features" in reason
            ), reason


def test_skip_keeps_modules_dense(family_dirs):
    cfg = QuantizationConfig(bits=8, skip=("lm_head", "layers.0."))
    pace = LLMModel(family_dirs["llama"], dtype=torch.float32, load_tokenizer=False,
                    quantization=cfg, opconfig=NATIVE)  # fmt: skip
    assert isinstance(pace.model.lm_head.weight.weight, torch.Tensor)
    first, second = pace.model.layers[:2]
    assert isinstance(first.attn.o_proj.weight.weight, torch.Tensor)
    assert isinstance(second.attn.o_proj.weight.weight, QuantizedWeight)


@pytest.mark.parametrize("family", ["llama", "phi3-longrope", "gemma3"])
def test_saved_quantized_copy_reloads_without_requantizing(family_dirs, family, tmp_path, capsys):
    from pace_core.cli import main

    out = tmp_path / "q"
    assert main(["models", "quantize", str(family_dirs[family]), str(out),
                 "--quantization", "int4", "--dtype", "float32"]) == 0  # fmt: skip
    saved = json.loads((out / "config.json").read_text())["quantization_config"]
    assert saved["quant_method"] == "pace" and saved["bits"] == 4
    fresh = LLMModel(family_dirs[family], dtype=torch.float32, load_tokenizer=False,
                     quantization="int4", opconfig=NATIVE)  # fmt: skip
    reloaded = LLMModel(out, dtype=torch.float32, load_tokenizer=False, opconfig=NATIVE)
    assert reloaded.quantization is None  # nothing re-quantized: the weights come as stored
    assert isinstance(reloaded.model.layers[0].attn.o_proj.weight.weight, QuantizedWeight)
    ids = torch.tensor([[3, 7, 11, 5, 9]])
    assert torch.equal(fresh.logits(ids), reloaded.logits(ids))
    size = sum(p.stat().st_size for p in out.glob("*.safetensors"))
    dense = sum(p.stat().st_size for p in family_dirs[family].glob("*.safetensors"))
    assert size < dense / 3


def test_a_multimodal_quantized_copy_holds_each_weight_once(tmp_path):
    """Gemma 3 ConditionalGeneration: the quantized text matrices replace their originals (the
    copy held both, and which one loaded depended on the file's order); it reloads quantized,
    with the logits of quantizing on load."""
    from support.tiny import gemma3_conditional

    from pace_core.models.quantized_copy import save_quantized
    from pace_core.models.text_part import text_name
    from pace_core.models.weights import WeightStore

    source = gemma3_conditional(tmp_path / "mm")
    out = save_quantized(source, tmp_path / "q", "int8", torch.float32)
    names = [text_name(n) or n for n in WeightStore.from_dir(out).names()]
    assert len(names) == len(set(names))
    reloaded = LLMModel(out, dtype=torch.float32, load_tokenizer=False, opconfig=NATIVE)
    assert isinstance(reloaded.model.layers[0].attn.o_proj.weight.weight, QuantizedWeight)
    fresh = LLMModel(source, dtype=torch.float32, load_tokenizer=False, quantization="int8",
                     opconfig=NATIVE)  # fmt: skip
    ids = torch.tensor([[3, 7, 11, 5, 9]])
    assert torch.equal(fresh.logits(ids), reloaded.logits(ids))


def test_saving_needs_a_quantization_and_an_original(family_dirs, tmp_path):
    from pace_core.models.quantized_copy import save_quantized

    with pytest.raises(ConfigError, match="needs a quantization"):
        save_quantized(family_dirs["llama"], tmp_path / "q", None)
    save_quantized(family_dirs["llama"], tmp_path / "q", "int8")
    with pytest.raises(ConfigError, match="already a quantized checkpoint"):
        save_quantized(tmp_path / "q", tmp_path / "q2", "int4")
    with pytest.raises(ConfigError, match="quantized experts are not saved yet"):
        save_quantized(family_dirs["qwen3-moe"], tmp_path / "moe", "int8-channel")
    assert not (tmp_path / "moe").exists()  # nothing half-written
    # over the source or another directory's files: refused (the source raised SameFileError)
    with pytest.raises(ConfigError, match="is the source directory: write the quantized copy"):
        save_quantized(tmp_path / "q", tmp_path / "q", "int8")
    with pytest.raises(ConfigError, match="is not an empty directory"):
        save_quantized(family_dirs["llama"], tmp_path / "q", "int4")


def test_a_saved_w8a8_copy_keeps_its_int8_activations(family_dirs, tmp_path):
    """The saved copy's weights carry W8A8's activation mode (it loaded as weight-only
    int8, other logits than the quantize-on-load model it was written from)."""
    from pace_core.models.quantized_copy import save_quantized

    out = save_quantized(family_dirs["llama"], tmp_path / "w8a8", "w8a8", torch.float32)
    fresh = LLMModel(family_dirs["llama"], dtype=torch.float32, load_tokenizer=False,
                     quantization="w8a8", opconfig=NATIVE)  # fmt: skip
    reloaded = LLMModel(out, dtype=torch.float32, load_tokenizer=False, opconfig=NATIVE)
    assert reloaded.model.layers[0].attn.o_proj.weight.weight.activations == "int8"
    ids = torch.tensor([[3, 7, 11, 5, 9]])
    assert torch.equal(fresh.logits(ids), reloaded.logits(ids))


def test_a_skip_string_is_one_name():
    """``skip="lm_head"`` was split into its letters: nearly every module was skipped."""
    cfg = QuantizationConfig(bits=4, group_size=32, symmetric=False, skip="lm_head")
    assert cfg.skip == ("lm_head",) and not cfg.skips("model.layers.0.self_attn.q_proj")
    assert QuantizationConfig(bits=8, skip=None).skip == ()  # (was a TypeError)


def test_a_quantized_copy_leaves_the_sources_gguf_files(family_dirs, tmp_path):
    """A zoo folder holds the model's GGUF files beside its checkpoint: they are weights of
    another form, not copied (SmolLM2's int4 copy was 681 MB, 97 MB of it the model)."""
    import shutil

    from pace_core.models.quantized_copy import save_quantized

    source = shutil.copytree(family_dirs["llama"], tmp_path / "src")
    (source / "model.q8_0.gguf").write_bytes(b"GGUF" + bytes(60))
    out = save_quantized(source, tmp_path / "q", "int8")
    assert (out / "config.json").is_file() and not list(out.glob("*.gguf"))


@pytest.mark.parametrize("preset", ["int8", "int8-channel", "int4", "int4-sym"])
def test_quantizing_in_chunks_equals_quantizing_whole(preset, monkeypatch):
    """Large matrices are quantized a few rows at a time into one output: same bytes."""
    import importlib

    quantize_module = importlib.import_module("pace_core.quant.quantize")  # not the function

    w = torch.randn(37, 64)
    whole = quantize(w, coerce_quantization(preset))
    monkeypatch.setattr(quantize_module, "CHUNK_ELEMENTS", 5 * 64)  # 5 rows, a ragged last
    chunked = quantize(w, coerce_quantization(preset))
    for a, b in ((whole.data, chunked.data), (whole.scales, chunked.scales),
                 (whole.mins, chunked.mins)):  # fmt: skip
        assert (a is None and b is None) or torch.equal(a, b)
    assert torch.equal(chunked.dequantize(), whole.dequantize())
