"""DLRMv2 (MLPerf's recommendation model) on pace's op framework: see ``docs/dlrm.md``.

from pace_core.dlrm import DLRM, DLRMConfig
m = DLRM.random(DLRMConfig.scaled(), quantization="int8", seed=0)
probs = m.predict(dense, sparse)
"""

from pace_core.dlrm.config import DLRMConfig, preset
from pace_core.dlrm.data import ClickBatch, SyntheticClicks, auc, logloss
from pace_core.dlrm.features import DLRMInputError
from pace_core.dlrm.model import DLRM
from pace_core.dlrm.quantize import DLRMQuantization
from pace_core.dlrm.reference import ReferenceDLRM

__all__ = [
    "DLRM",
    "ClickBatch",
    "DLRMConfig",
    "DLRMInputError",
    "DLRMQuantization",
    "ReferenceDLRM",
    "SyntheticClicks",
    "auc",
    "logloss",
    "preset",
]
