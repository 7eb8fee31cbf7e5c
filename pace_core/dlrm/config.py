"""DLRMv2 shapes: the MLPerf model, a scaled-down preset that fits one small machine, and a tiny
one for tests."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from pace_core.errors import ConfigError

# MLPerf DLRMv2 (Criteo 1TB multi-hot; torchrec's DLRM_DCN as the MLPerf reference runs it):
# rows per table and the fixed multi-hot size of each of the 26 sparse features.
MLPERF_TABLE_ROWS: tuple[int, ...] = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
MLPERF_MULTI_HOT: tuple[int, ...] = (
    3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1,
)  # fmt: skip
SCALED_MAX_ROWS = 100_000  # rows per table of the scaled preset (~0.5 GB of fp32 tables)


@dataclass(frozen=True)
class DLRMConfig:
    """A DLRMv2 architecture: bottom MLP over the dense features, sum-pooled embedding bags
    (one table per sparse feature), the DCNv2 low-rank cross stack over ``[bottom | bags]``,
    then the top MLP to one logit (sigmoid: the click probability).

    The defaults are MLPerf's (:meth:`mlperf`); :meth:`scaled` caps the tables' rows.
    """

    table_rows: tuple[int, ...] = MLPERF_TABLE_ROWS
    multi_hot: tuple[int, ...] = MLPERF_MULTI_HOT
    dense_features: int = 13
    embedding_dim: int = 128
    bottom_mlp: tuple[int, ...] = (512, 256, 128)
    top_mlp: tuple[int, ...] = (1024, 1024, 512, 256, 1)
    cross_layers: int = 3
    cross_rank: int = 512
    name: str = field(default="mlperf", compare=False)

    def __post_init__(self) -> None:
        for key in ("table_rows", "multi_hot", "bottom_mlp", "top_mlp"):
            object.__setattr__(self, key, tuple(int(v) for v in getattr(self, key)))
        if len(self.table_rows) != len(self.multi_hot) or not self.table_rows:
            raise ConfigError(
                f"DLRMConfig needs one multi-hot size per table: {len(self.table_rows)} tables, "
                f"{len(self.multi_hot)} multi-hot sizes"
            )
        if min(self.table_rows) < 1 or min(self.multi_hot) < 0:
            raise ConfigError("DLRMConfig: every table needs >= 1 row and multi-hot size >= 0")
        if not self.bottom_mlp or self.bottom_mlp[-1] != self.embedding_dim:
            raise ConfigError(
                f"the bottom MLP must end at embedding_dim {self.embedding_dim} "
                f"(got {self.bottom_mlp}): its output joins the embedding bags"
            )
        if not self.top_mlp or self.top_mlp[-1] != 1:
            raise ConfigError(f"the top MLP must end in 1 logit (got {self.top_mlp})")
        if self.cross_layers < 0 or self.cross_rank < 1:
            raise ConfigError("cross_layers must be >= 0 and cross_rank >= 1")

    @property
    def sparse_features(self) -> int:
        return len(self.table_rows)

    @property
    def interaction_dim(self) -> int:
        """Width of the cross stack's input: the bottom MLP's output and one bag per table."""
        return (self.sparse_features + 1) * self.embedding_dim

    def table_bytes(self, bytes_per_value: float = 4.0) -> int:
        """Bytes of the embedding tables at ``bytes_per_value`` (int8: 1, plus 4 per row)."""
        return int(sum(self.table_rows) * self.embedding_dim * bytes_per_value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DLRMConfig:
        return cls(**data)

    @classmethod
    def mlperf(cls) -> DLRMConfig:
        """MLPerf DLRMv2 as published: ~204M rows, 98 GiB of fp32 tables."""
        return cls()

    @classmethod
    def scaled(cls, max_rows: int = SCALED_MAX_ROWS) -> DLRMConfig:
        """MLPerf DLRMv2 with each table capped at ``max_rows`` rows (everything else real)."""
        rows = tuple(min(r, max_rows) for r in MLPERF_TABLE_ROWS)
        return cls(table_rows=rows, name=f"scaled-{max_rows}")

    @classmethod
    def tiny(cls) -> DLRMConfig:
        """A few small tables and narrow layers (tests): every kernel path, in milliseconds."""
        return cls(
            table_rows=(100, 37, 500, 3), multi_hot=(3, 1, 5, 2), embedding_dim=32,
            bottom_mlp=(64, 32), top_mlp=(64, 32, 1), cross_layers=2, cross_rank=32,
            name="tiny",
        )  # fmt: skip

    def with_rows(self, max_rows: int) -> DLRMConfig:
        return replace(self, table_rows=tuple(min(r, max_rows) for r in self.table_rows))


PRESETS = {"mlperf": DLRMConfig.mlperf, "scaled": DLRMConfig.scaled, "tiny": DLRMConfig.tiny}


def preset(name: str) -> DLRMConfig:
    """A preset by name: ``mlperf``, ``scaled`` (rows <= 100k) or ``tiny``."""
    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(
            f"unknown DLRM preset {name!r}; choose one of {', '.join(PRESETS)}"
        ) from None
