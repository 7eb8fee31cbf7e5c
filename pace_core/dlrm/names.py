"""Tensor names of a DLRMv2 state dict: torchrec's ``DLRM_DCN`` (what the MLPerf reference
checkpoint holds, there under a ``model.`` prefix, which loading strips)."""

from __future__ import annotations

from pace_core.dlrm.config import DLRMConfig

TABLES = "sparse_arch.embedding_bag_collection.embedding_bags"
BOTTOM = "dense_arch.model._mlp"
CROSS = "inter_arch.crossnet"
TOP = "over_arch.model"


def tables(config: DLRMConfig) -> list[str]:
    """One ``[rows, D]`` weight per sparse feature ``cat_i``."""
    return [f"{TABLES}.t_cat_{i}.weight" for i in range(config.sparse_features)]


def bottom(config: DLRMConfig) -> list[str]:
    """Module names (``.weight`` / ``.bias``) of the bottom MLP's layers."""
    return [f"{BOTTOM}.{i}._linear" for i in range(len(config.bottom_mlp))]


def top(config: DLRMConfig) -> list[str]:
    """The top MLP: torchrec's ``OverArch`` is an MLP (ReLU) then one plain linear."""
    mlp = [f"{TOP}.0._mlp.{i}._linear" for i in range(len(config.top_mlp) - 1)]
    return [*mlp, f"{TOP}.1"]


def cross(config: DLRMConfig) -> list[tuple[str, str, str]]:
    """Per cross layer: ``V [r, D]``, ``U [D, r]`` (torchrec's ``W_kernels``), bias ``[D]``."""
    return [
        (f"{CROSS}.V_kernels.{i}", f"{CROSS}.W_kernels.{i}", f"{CROSS}.bias.{i}")
        for i in range(config.cross_layers)
    ]


def shapes(config: DLRMConfig) -> dict[str, tuple[int, ...]]:
    """Every tensor of the state dict and its shape."""
    out: dict[str, tuple[int, ...]] = {}
    for name, rows in zip(tables(config), config.table_rows, strict=True):
        out[name] = (rows, config.embedding_dim)
    widths = [config.dense_features, *config.bottom_mlp]
    for name, k, n in zip(bottom(config), widths, widths[1:], strict=False):
        out[f"{name}.weight"], out[f"{name}.bias"] = (n, k), (n,)
    d, r = config.interaction_dim, config.cross_rank
    for v, u, b in cross(config):
        out[v], out[u], out[b] = (r, d), (d, r), (d,)
    widths = [d, *config.top_mlp]
    for name, k, n in zip(top(config), widths, widths[1:], strict=False):
        out[f"{name}.weight"], out[f"{name}.bias"] = (n, k), (n,)
    return out
