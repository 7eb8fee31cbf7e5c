"""Entry point of pace-native: registers every op of the catalogue at the lowest priority."""

from __future__ import annotations

import torch

from pace_core import hookimpl
from pace_core.caches.kv_quant import KV_DTYPES
from pace_core.quant import WEIGHT_FORMATS
from pace_core.registry import Registrations
from pace_native import dlrm, kernels

PACE_CONTRACT_VERSION = 1  # the pace_core.CONTRACT_VERSION this plugin implements

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
FORMATS = WEIGHT_FORMATS  # every weight format: de-quantize a tile of rows, torch matmul


@hookimpl
def pace_register_ops(registry: Registrations) -> None:
    add = registry.add_kernel
    add("embedding", "native", kernels.embedding, dtypes=DTYPES, weight_formats=FORMATS)
    add("linear", "native", kernels.linear, prepare=kernels.prepare_linear, dtypes=DTYPES,
        weight_formats=FORMATS)  # fmt: skip
    add("qkv_proj", "native", kernels.qkv_proj, prepare=kernels.prepare_qkv, dtypes=DTYPES,
        weight_formats=FORMATS)  # fmt: skip
    add("gated_mlp", "native", kernels.gated_mlp, prepare=kernels.prepare_gated_mlp,
        dtypes=DTYPES, weight_formats=FORMATS)  # fmt: skip
    add("moe", "native", kernels.moe, prepare=kernels.prepare_moe, dtypes=DTYPES,
        weight_formats=FORMATS)  # fmt: skip
    add("rms_norm", "native", kernels.rms_norm, dtypes=DTYPES)
    add("layer_norm", "native", kernels.layer_norm, dtypes=DTYPES)
    add("rope", "native", kernels.rope, dtypes=DTYPES)
    add(
        "attention",
        "native",
        kernels.attention,
        dtypes=DTYPES,
        cache_layouts=("contiguous", "paged", "slab"),
        kv_dtypes=KV_DTYPES,
    )
    add(
        "latent_attention",
        "native",
        kernels.latent_attention,
        dtypes=DTYPES,
        cache_layouts=("contiguous", "paged", "slab"),
    )
    add("embedding_bag", "native", dlrm.embedding_bag, prepare=dlrm.prepare_embedding_bag,
        dtypes=DTYPES, weight_formats=("dense", "int8"))  # fmt: skip
    add("cross_interaction", "native", dlrm.cross_interaction,
        prepare=dlrm.prepare_cross_interaction, dtypes=DTYPES, weight_formats=FORMATS)  # fmt: skip
    add(
        "decoder_stack",
        "native",
        kernels.decoder_stack,
        prepare=kernels.prepare_decoder_stack,
        dtypes=DTYPES,
        weight_formats=FORMATS,
        kv_dtypes=KV_DTYPES,  # the layers' own attention kernels read the cache
    )
