"""pace as a ``torch.compile`` backend: any torch model's linears, gated MLPs, norms and
embeddings run on the plugin kernels the OperatorConfig resolver picks (docs/compile.md)."""

from pace_core.compile.backend import PaceBackend, compile, pace_backend

__all__ = ["PaceBackend", "compile", "pace_backend"]
