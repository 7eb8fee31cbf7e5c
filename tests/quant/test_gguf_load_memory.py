"""GGUF loading at the memory floor, checked on tiny files (fast; the whole-model RSS bars at
real sizes are ``pace bench loading``'s, and tests/quant/test_loading_memory.py's, slow):

- the loader reads each tensor into memory of its own: the file's map never holds tensor
  pages, so the file is not resident next to the packed copies while the model builds;
- a tied table packed for the LM head is the only copy the model keeps (no GGUF blocks and
  no de-quantized float table next to it);
- pace-avx512 converts a bounded number of values at a time whatever the row length.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from support.isa import require_avx512
from support.tiny_gguf import TINY, write_gguf

from pace_core import LLMModel
from pace_core.models import gguf_source
from pace_core.models.gguf_header import GGUFHeader
from pace_core.quant import QuantizedWeight
from pace_core.quant.memory import reachable

pytest.importorskip("gguf")

TYPES = {"token_embd": "q6_k", "": "q4_k"}  # tied (qwen2): the head is the q6_k table


@pytest.fixture(scope="module")
def tied_gguf(tmp_path_factory) -> Path:
    hf = TINY["qwen2"](tmp_path_factory.mktemp("qwen2-hf"))
    return write_gguf(hf, tmp_path_factory.mktemp("qwen2-gguf") / "tied.gguf", TYPES)


def mapped_rss(path: Path) -> int:
    """Resident bytes of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            fields = line.split()
            if "-" in fields[0] and len(fields) >= 5:  # a mapping's header line
                inside = fields[-1] == str(path)
            elif inside and fields[0] == "Rss:":
                total += int(fields[1]) * 1024
    return total


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="needs /proc/self/smaps")
def test_building_a_model_faults_in_no_tensor_pages(tied_gguf, monkeypatch):
    monkeypatch.setattr(gguf_source, "release_pages", lambda file: None)  # look before it
    gguf_source._cached_header.cache_clear()
    header = gguf_source._header(tied_gguf)
    data_start = min(t.offset for t in header.tensors)
    size = tied_gguf.stat().st_size
    assert size > 8 * (data_start + (64 << 10))  # the tensors dominate the file
    llm = LLMModel(tied_gguf, dtype=torch.bfloat16, load_tokenizer=False, quiet=True)
    assert llm.model is not None
    # the header's pages (and the kernel's fault-around), never the tensors'
    assert mapped_rss(tied_gguf.resolve()) <= data_start + (64 << 10)
    gguf_source._cached_header.cache_clear()


def test_read_is_the_tensor_in_memory_of_its_own(tied_gguf):
    header = GGUFHeader(tied_gguf)
    for t in header.tensors[:4]:
        mine = header.read(t)
        assert torch.equal(mine, header.data(t))
        view = header.data(t)
        start, end = view.data_ptr(), view.data_ptr() + t.nbytes
        assert not start <= mine.data_ptr() < end


def test_a_packed_tied_table_is_the_only_copy(tied_gguf):
    pytest.importorskip("pace_avx512")
    llm = LLMModel(tied_gguf, dtype=torch.bfloat16, load_tokenizer=False, quiet=True)
    if llm.model.plan.backends().get("linear") != {"avx512"}:
        pytest.skip("pace-avx512 does not run the linears here")
    vocab = llm.config.vocab_size
    head = llm.model.lm_head.weight
    assert llm.model.embed.weight is head  # the lookup reads rows of the packed head
    objects = reachable(llm.model)
    tables = [o for o in objects if isinstance(o, QuantizedWeight) and o.shape[0] == vocab]
    floats = [o for o in objects if isinstance(o, torch.Tensor) and o.dim() == 2
              and o.shape[0] == vocab]  # fmt: skip
    assert tables == [] and floats == []


def test_packing_converts_bounded_chunks_at_any_row_length(monkeypatch):
    require_avx512()
    from pace_avx512 import qpacking

    n, k = 256, 8192
    gen = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (n, k // 256, 210), dtype=torch.uint8, generator=gen)
    blocks[..., 208:210] = torch.tensor([0x00, 0x3C], dtype=torch.uint8)  # d = 1.0 (fp16)
    w = QuantizedWeight("q6_k", (n, k), torch.bfloat16, blocks.reshape(n, -1))
    sizes = []
    convert = qpacking._codes_tables

    def counted(weight, rows, kind):
        sizes.append(len(range(*rows.indices(weight.shape[0]))) * weight.shape[1])
        return convert(weight, rows, kind)

    monkeypatch.setattr(qpacking, "_codes_tables", counted)
    monkeypatch.setattr(qpacking, "CHUNK_ELEMENTS", 64 * k)
    packed, _ = qpacking.pack(w)
    assert max(sizes) <= 64 * k and len(sizes) == n // 64
    monkeypatch.setattr(qpacking, "CHUNK_ELEMENTS", n * k)  # one chunk: the same bytes
    whole, _ = qpacking.pack(w)
    assert torch.equal(packed, whole)


@pytest.mark.slow
@pytest.mark.parametrize("ftype", ["q8_0", "q4_k_m"])
def test_full_depth_1b_gguf_loads_within_the_bars(ftype):
    """Issue #43's bars on a full-depth Llama-3.2-1B shape made by llama.cpp (its converter and
    quantizer: ``make bench-peers`` or ``make bench-llama-cpp``), in a fresh process.
    pace-avx512 packs Q4_K_M's q4_k tensors at 4.625 bits a weight (the file: 4.5; 830M weights,
    480 against 467 MB) and its q6_k ones at 7 (6.56; 405M, 355 against 332 MB), so the packed
    model is 835 MB, 1.04x the 803 MB file, and it meets the file's resident bar too (1.25 GB
    against 1.28 measured; with q4_k at 5 bits, 874 MB, 1.09x, it missed it by ~10 MB and was
    held to 1.1x what it keeps + 0.4 GB; 1.21x when q6_k also took 8-bit codes, 9 bits a
    weight)."""
    from pace_bench import peers
    from pace_bench.loading import after_ok, measure, peak_ok
    from pace_bench.random_models import random_gguf

    try:
        peers.require_quantizer()
    except peers.PeerUnavailable as e:
        pytest.skip(str(e))
    if peers.find_converter() is None:
        pytest.skip("needs llama.cpp's converter (make bench-peers or make bench-llama-cpp)")
    file = random_gguf("random:llama-3.2-1b", ftype)
    m = measure(str(file), None, "bfloat16")
    size = file.stat().st_size
    assert peak_ok(m["weights_peak"], size), m
    assert after_ok(m["rss"], size), m
    # q8_0 packed as the file stores it; q4_k_m at 1.04x (above)
    assert m["weights"] <= (1.01 if ftype == "q8_0" else 1.05) * size, m
