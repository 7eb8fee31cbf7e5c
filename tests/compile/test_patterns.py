"""The pace backend's attention-side, fused-norm and int8 patterns: each compiled module
equals its eager self (fp32) and the pattern reached a plugin kernel (the backend's matched
patterns and op plan)."""

from __future__ import annotations

import pytest
import torch
import torch.ao.quantization.fx._decomposed  # registers PT2E's de-quantize ops
import torch.nn.functional as F
from support.isa import needs_avx512_int8
from support.no_family import fresh_dynamo  # noqa: F401 (a fixture)

import pace_core.compile as pc

pytestmark = pytest.mark.usefixtures("fresh_dynamo")


def rotate_half(x: torch.Tensor) -> torch.Tensor:  # transformers' own
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):  # transformers' own
    cos = cos.unsqueeze(unsqueeze_dim)
    sin = sin.unsqueeze(unsqueeze_dim)
    return (q * cos) + (rotate_half(q) * sin), (k * cos) + (rotate_half(k) * sin)


class Attention(torch.nn.Module):
    """q/k/v projections, rope and SDPA as transformers writes them."""

    def __init__(self, hidden: int = 64, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.d = heads, kv_heads, hidden // heads
        self.q = torch.nn.Linear(hidden, heads * self.d, bias=False)
        self.k = torch.nn.Linear(hidden, kv_heads * self.d, bias=False)
        self.v = torch.nn.Linear(hidden, kv_heads * self.d, bias=False)
        inv = 1.0 / (10000 ** (torch.arange(0, self.d, 2).float() / self.d))
        self.register_buffer("inv_freq", inv, persistent=False)

    def forward(self, x, positions, mask=None, causal=False):
        b, t, _ = x.shape
        q = self.q(x).view(b, t, -1, self.d).transpose(1, 2)
        k = self.k(x).view(b, t, -1, self.d).transpose(1, 2)
        v = self.v(x).view(b, t, -1, self.d).transpose(1, 2)
        freqs = positions[..., None].float() * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        q, k = apply_rotary_pos_emb(q, k, emb.cos(), emb.sin())
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=causal, scale=0.3, enable_gqa=True
        )
        return out, q, k


def _inputs(b: int = 2, t: int = 7):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(b, t, 64, generator=gen)
    positions = torch.arange(t).repeat(b, 1) + torch.tensor([[0], [3]])
    return x, positions


@pytest.mark.parametrize("masking", ["causal", "mask", "none"])
def test_rope_and_sdpa_run_on_the_plugin_kernels(masking):
    torch.manual_seed(0)
    model = Attention().eval()
    x, positions = _inputs()
    t = x.shape[1]
    mask = None
    if masking == "mask":  # left padding of row 0 over a causal mask
        mask = torch.ones(t, t, dtype=torch.bool).tril().repeat(2, 1, 1, 1)
        mask[0, :, :, :2] = False
        mask[0, :, :2, 0] = True
    args = (x, positions, mask, masking == "causal")
    with torch.no_grad():
        want = model(*args)
        backend = pc.PaceBackend()
        got = torch.compile(model, backend=backend)(*args)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    assert backend.matched["rope"] == 1 and backend.matched["sdpa"] == 1, backend.matched
    assert {"rope", "attention"} <= set(backend.plan.backends())


def test_sdpa_with_dropout_or_a_float_mask_stays_torch():
    class Float(torch.nn.Module):
        def forward(self, q, k, v, bias):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias)

    q = torch.randn(1, 2, 3, 8)
    backend = pc.PaceBackend()
    with torch.no_grad():
        out = torch.compile(Float(), backend=backend)(q, q, q, torch.zeros(1, 1, 3, 3))
    torch.testing.assert_close(out, F.scaled_dot_product_attention(q, q, q))
    assert backend.matched["sdpa"] == 0


class RMSNorm(torch.nn.Module):  # transformers' LlamaRMSNorm
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(1 + 0.1 * torch.randn(width))

    def forward(self, x):
        h = x.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)
        return self.weight * h.to(x.dtype)


class Residual(torch.nn.Module):
    """A pre-norm block's residual adds: the second norm reads ``x + f(x)``, the sum is the
    next residual."""

    def __init__(self, norm: str, width: int = 64) -> None:
        super().__init__()
        make = RMSNorm if norm == "rms" else torch.nn.LayerNorm
        self.norm1, self.norm2 = make(width), make(width)
        if norm != "rms":
            for n in (self.norm1, self.norm2):
                torch.nn.init.normal_(n.weight, 1.0, 0.1)
                torch.nn.init.normal_(n.bias, 0.0, 0.1)
        self.f = torch.nn.Linear(width, width, bias=False)
        self.g = torch.nn.Linear(width, width, bias=False)

    def forward(self, x):
        h = x + self.f(self.norm1(x))
        return h + self.g(self.norm2(h))


@pytest.mark.parametrize("norm", ["rms", "layer"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_residual_add_and_norm_fuse(norm, dtype):
    torch.manual_seed(0)
    model = Residual(norm).to(dtype).eval()
    x = torch.randn(2, 5, 64).to(dtype)
    with torch.no_grad():
        want = model(x)
        backend = pc.PaceBackend()
        got = torch.compile(model, backend=backend)(x)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    assert backend.matched[f"residual_{norm}_norm"] == 1
    assert backend.matched[f"{norm}_norm"] == 1
    assert backend.left_to_torch == 0


def _fp16_exact(t: torch.Tensor) -> torch.Tensor:
    """Scales pace stores as fp16 without rounding (the comparison is then exact)."""
    return t.to(torch.float16).float()


class Int8Linear(torch.nn.Module):
    """A weight stored as int8 codes with one scale per output row, de-quantized in the
    forward (``form``: how the module writes it)."""

    def __init__(self, n: int, k: int, form: str) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(0)
        self.register_buffer(
            "codes", torch.randint(-127, 128, (n, k), generator=gen).to(torch.int8)
        )
        scales = _fp16_exact(torch.rand(n, generator=gen) * 1e-2 + 1e-3)
        self.register_buffer("scales", scales if form != "mul" else scales[:, None].clone())
        self.register_buffer("zeros", torch.zeros(n, dtype=torch.int64))
        self.bias = torch.nn.Parameter(torch.randn(n, generator=gen))
        self.form = form

    def weight(self, dtype: torch.dtype) -> torch.Tensor:
        if self.form == "mul":  # codes.to(dtype) * scales [N, 1]
            return self.codes.to(dtype) * self.scales
        if self.form == "index":  # scales [N] indexed to a column
            return self.codes.to(dtype) * self.scales[:, None]
        return torch.ops.quantized_decomposed.dequantize_per_channel(
            self.codes, self.scales, self.zeros, 0, -128, 127, torch.int8
        )

    def forward(self, x):
        return torch.relu(F.linear(x, self.weight(x.dtype), self.bias))


@pytest.mark.parametrize("form", ["mul", "index", "pt2e"])
def test_dequantized_int8_weight_runs_as_an_int8_linear(form):
    """On the reference kernel the result is the module's own (same codes, same scales)."""
    model = Int8Linear(96, 128, form).eval()
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x)
        backend = pc.PaceBackend({"linear": "native"})
        got = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert backend.matched["int8_linear"] == 1, backend.matched
    assert backend.left_to_torch == 0
    (res,) = [r for r in backend.plan.resolutions if r.op == "linear"]
    assert res.backend == "native"


@needs_avx512_int8
def test_int8_linear_on_the_vnni_kernel():
    """pace-avx512's int8 kernel takes fp32 activations as 15-bit integers: within 1e-2."""
    model = Int8Linear(96, 128, "mul").eval()
    x = torch.randn(3, 128, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(x)
        backend = pc.PaceBackend()
        got = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(got, want, rtol=1e-2, atol=2e-3)
    (res,) = [r for r in backend.plan.resolutions if r.op == "linear"]
    assert res.backend == "avx512", str(backend.plan)
