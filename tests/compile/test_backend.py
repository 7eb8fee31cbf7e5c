"""The pace torch.compile backend on transformers architectures pace has no family for: the
same logits and greedy tokens as transformers eager (fp32), with the catalogue's ops bound to
plugin kernels and their weights prepared once."""

from __future__ import annotations

import pytest
import torch
from support.no_family import fresh_dynamo, no_family_model  # noqa: F401 (a fixture)
from transformers import AutoModelForCausalLM

import pace_core.compile as pc
from pace_core.errors import OpResolutionError

# model_type -> (extra config, the ops its graph must hand to plugin kernels)
SDPA_ROPE = {"rope", "attention"}
ARCHS = {
    "olmo2": (
        {"num_key_value_heads": 2},
        {"linear", "gated_mlp", "rms_norm", "embedding", *SDPA_ROPE},
    ),
    "gpt_neox": ({"rotary_pct": 0.5}, {"linear", "layer_norm", "embedding", *SDPA_ROPE}),
    "granite": (
        {"num_key_value_heads": 2, "residual_multiplier": 0.5, "logits_scaling": 2.0},
        {"linear", "gated_mlp", "rms_norm", "embedding", *SDPA_ROPE},
    ),
}


pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def tiny(arch: str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    return no_family_model(arch, dtype, **ARCHS[arch][0])


def twin(model: torch.nn.Module) -> torch.nn.Module:
    other = AutoModelForCausalLM.from_config(model.config, dtype=model.dtype).eval()
    other.load_state_dict(model.state_dict())
    return other


@pytest.mark.parametrize("arch", list(ARCHS))
def test_compiled_matches_transformers_fp32(arch):
    model = tiny(arch)
    reference = twin(model)
    ids = torch.randint(0, 300, (2, 9), generator=torch.Generator().manual_seed(1))
    backend = pc.compile(model)
    with torch.no_grad():
        got, want = model(ids).logits, reference(ids).logits
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        tokens = model.generate(ids, max_new_tokens=12, do_sample=False)
        expected = reference.generate(ids, max_new_tokens=12, do_sample=False)
    assert tokens.tolist() == expected.tolist()
    bound = set(backend.plan.backends())
    assert bound == ARCHS[arch][1], str(backend.plan)
    assert backend.left_to_torch == 0  # every linear went to a kernel, none computed twice
    # every matched weight was prepared once, however many graphs (prefill, decode) compiled
    assert backend.graphs >= 2
    matrices = sum(1 for p in model.parameters() if p.dim() == 2) - 1  # not the embedding
    assert (
        0 < len(backend.prepared) <= matrices + sum(1 for p in model.parameters() if p.dim() == 1)
    )


def test_bf16_top1_agrees_with_transformers():
    model = tiny("olmo2", torch.bfloat16)
    reference = twin(model)
    ids = torch.randint(0, 300, (1, 24), generator=torch.Generator().manual_seed(2))
    pc.compile(model)
    with torch.no_grad():
        got, want = model(ids).logits.float(), reference(ids).logits.float()
    top = want.topk(2, dim=-1).values
    clear = (top[..., 0] - top[..., 1]) > 0.05  # positions without a near-tie
    agree = got.argmax(-1) == want.argmax(-1)
    assert bool(agree[clear].all()), "top-1 differs where transformers has a clear winner"
    kl = torch.nn.functional.kl_div(
        got.log_softmax(-1), want.log_softmax(-1), log_target=True, reduction="batchmean"
    )
    assert kl.item() < 1e-3


def test_backend_by_name_through_the_entry_point():
    model = tiny("gpt_neox")
    reference = twin(model)
    compiled = torch.compile(model, backend="pace")
    ids = torch.tensor([[3, 1, 4, 1, 5]])
    with torch.no_grad():
        torch.testing.assert_close(compiled(ids).logits, reference(ids).logits)
    from pace_core.compile import backend as module

    assert module._default is not None and "linear" in module._default.plan.backends()


def test_pinned_backend_falls_back_with_its_reason_or_fails_strict():
    model = tiny("olmo2")
    backend = pc.compile(model, opconfig={"embedding": "avx512"})
    with torch.no_grad():
        model(torch.tensor([[1, 2, 3]]))
    (site,) = [k for k in backend.plan.sites if k[0] == "embedding"]
    assert site[1] == "native" and "avx512" in site[2], str(backend.plan)

    torch._dynamo.reset()
    strict = tiny("olmo2")
    pc.compile(strict, opconfig={"embedding": "avx512", "strict": True})
    with pytest.raises(Exception) as info, torch.no_grad():
        strict(torch.tensor([[1, 2, 3]]))
    assert isinstance(info.value, OpResolutionError) or "OpResolutionError" in str(info.value)


def test_unknown_backend_name_is_a_config_error():
    from pace_core.errors import ConfigError

    with pytest.raises(ConfigError, match="nope"):
        pc.PaceBackend({"linear": "nope"})


class _Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.up = torch.nn.Linear(width, 2 * width)
        self.down = torch.nn.Linear(2 * width, width, bias=False)
        self.norm = torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.down(torch.relu(self.up(self.norm(x))))
        torch._dynamo.graph_break()  # each block's code compiles once, for every block
        return x + h


class _Net(torch.nn.Module):
    def __init__(self, width: int = 32, depth: int = 4) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(_Block(width) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return x


def test_a_graph_reused_across_layers_reads_each_layers_weights():
    """Dynamo compiles the block's code once and calls it with each block's parameters: every
    call must use its own block's (prepared) weights."""
    torch.manual_seed(0)
    net = _Net().eval()
    x = torch.randn(3, 32)
    with torch.no_grad():
        want = net(x)
        backend = pc.compile(net)
        got = net(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert backend.graphs < len(net.blocks), "the block's graph was not shared"
    assert {"linear", "layer_norm"} <= set(backend.plan.backends())


def test_prepared_weights_leave_with_their_model():
    import gc

    backend = pc.PaceBackend()
    model = _Net(depth=2).eval()
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        compiled(torch.randn(2, 32))
    assert len(backend.prepared) > 0
    del compiled, model
    torch._dynamo.reset()  # Dynamo's caches hold the graphs' example inputs
    gc.collect()
    assert len(backend.prepared) == 0
