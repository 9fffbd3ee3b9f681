"""Cost models: the Mamba block (``mamba``), the Mamba / Tenset-MLP / TLP nets (``nets``),
the XGBoost baseline (``xgb``) and checkpoints (``checkpoint``).

Heavy imports (torch) happen on first use of a re-exported name, so ``import tcl.models.xgb``
does not pull torch in.
"""

from __future__ import annotations

__all__ = ["build_model", "load_preset", "save_checkpoint", "load_checkpoint",
           "count_parameters", "model_size_mb", "flops_per_prediction"]

_NETS = {"build_model", "load_preset", "count_parameters", "model_size_mb", "flops_per_prediction"}
_CKPT = {"save_checkpoint", "load_checkpoint"}


def __getattr__(name: str):
    if name in _NETS:
        from tcl.models import nets

        return getattr(nets, name)
    if name in _CKPT:
        from tcl.models import checkpoint

        return getattr(checkpoint, name)
    raise AttributeError(f"module 'tcl.models' has no attribute {name!r}")
