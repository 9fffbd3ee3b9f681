"""Cost models and the one registry of their kinds.

Every kind implements ``tcl.models.base.CostModel`` (fit / predict / embed / save / load):
``mamba``, ``mlp``, ``tlp`` (torch nets, ``nets.py``; the Mamba block in ``mamba.py``), ``mtl``
(a Mamba backbone with one head per platform, ``multihead.py``) and ``xgb`` (``xgb.py``) on step
sequences; ``xgb-ms`` (``ms_xgb.py``) and ``mlp-tenset`` (``tenset_mlp.py``),
the baselines as their libraries define them, on MetaSchedule's per-store features. Callers
build, load and configure models through the functions here and never branch on the kind.

Adding a kind: write a ``CostModel`` subclass in its own module (a kind over other features
overrides ``inputs``, as ``base.PerStoreCostModel`` does) and add one line to ``_KINDS`` below. Its classes are imported on
first use, so ``import tcl.models`` pulls in neither torch nor xgboost.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from tcl.models.base import CostModel


def _net(kind: str) -> type[CostModel]:
    from tcl.models.nets import NET_MODELS

    return NET_MODELS[kind]


def _xgb(kind: str) -> type[CostModel]:
    from tcl.models.xgb import XGBModel

    return XGBModel


def _ms_xgb(kind: str) -> type[CostModel]:
    from tcl.models.ms_xgb import MSXGBModel

    return MSXGBModel


def _tenset_mlp(kind: str) -> type[CostModel]:
    from tcl.models.tenset_mlp import TensetMLPModel

    return TensetMLPModel


def _multihead(kind: str) -> type[CostModel]:
    from tcl.models.multihead import MultiHeadModel

    return MultiHeadModel


# kind -> its CostModel class, loaded on first use
_KINDS = {
    "mamba": _net, "mlp": _net, "tlp": _net, "xgb": _xgb,   # step sequences (FeatureSet)
    "xgb-ms": _ms_xgb,           # MetaSchedule's XGBModel on per-store features (PerStoreSet)
    "mlp-tenset": _tenset_mlp,   # Tenset's segment-sum MLP on per-store features (PerStoreSet)
    "mtl": _multihead,           # a Mamba backbone with one head per platform (MTL-TLP's transfer baseline)
}
KINDS: tuple[str, ...] = tuple(_KINDS)
MODEL_FILES = ("model.pt", "model.json")  # what `fit` writes into its output directory

__all__ = ["CostModel", "KINDS", "model_class", "new_model", "load_model", "model_config",
           "parse_model_name", "resolve_model_path"]


def model_class(kind: str) -> type[CostModel]:
    if kind not in _KINDS:
        raise ValueError(f"unknown model kind {kind!r}; choose one of {', '.join(KINDS)}")
    return _KINDS[kind](kind)


def new_model(kind: str, n_features: int, config: dict | None = None,
              feature_meta: dict | None = None) -> CostModel:
    """A freshly initialised model of `kind` (torch's global RNG draws its initial weights)."""
    return model_class(kind)(int(n_features), config=config, feature_meta=feature_meta)


def parse_model_name(name: str) -> tuple[str, str | None]:
    """``mamba-kb`` -> (mamba, kb); ``mlp`` or ``xgb-ms`` -> (its kind, None): the names
    benchmarks take."""
    if name in _KINDS:
        return name, None
    kind, _, preset = name.rpartition("-") if "-" in name else (name, "", "")
    model_class(kind)
    return kind, preset or None


def model_config(kind: str, params: dict, preset: str | None = None) -> dict:
    """The config of `kind` in params (``models.<kind>``; a kind with presets, e.g. Mamba:
    ``models.<kind>.<preset>``, its ``default_preset`` when `preset` is None)."""
    section = dict(((params.get("models") or {}).get(kind)) or {})
    preset = preset or model_class(kind).default_preset
    if preset is None:
        return section
    if not isinstance(section.get(preset), dict):
        presets = sorted(k for k, v in section.items() if isinstance(v, dict))
        raise KeyError(f"no {kind} preset {preset!r} under models.{kind} (presets: {', '.join(presets) or 'none'})")
    return dict(section[preset])


def resolve_model_path(path: str | os.PathLike) -> Path:
    """A saved model file from a file or a training output directory."""
    path = Path(path)
    if path.is_dir():
        for name in MODEL_FILES:
            if (path / name).is_file():
                return path / name
        found = [f for name in MODEL_FILES for f in sorted(path.rglob(name))]
        if not found:
            raise FileNotFoundError(f"no {' or '.join(MODEL_FILES)} under {path}")
        return found[0]
    if not path.is_file():
        raise FileNotFoundError(f"no model file or training output at {path}")
    return path


def saved_kind(path: str | os.PathLike) -> str:
    """The kind recorded in a saved model file (a torch checkpoint or an XGBoost JSON)."""
    path = Path(path)
    if path.suffix == ".json":
        try:
            attrs = json.loads(path.read_text())["learner"]["attributes"]
            return str(attrs["tcl_kind"])
        except (OSError, ValueError, KeyError, TypeError):
            raise ValueError(f"{path}: not a TCL model file (no learner.attributes.tcl_kind)") from None
    from tcl.models.checkpoint import read_checkpoint

    return str(read_checkpoint(path)[1]["kind"])


def load_model(path: str | os.PathLike) -> CostModel:
    """The model saved at `path` (a file or a training output directory), of whatever kind."""
    path = resolve_model_path(path)
    return model_class(saved_kind(path)).load(path)
