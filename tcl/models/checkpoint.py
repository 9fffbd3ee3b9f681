"""Cost-model checkpoints: tensors + JSON, loadable with ``torch.load(weights_only=True)``.

A checkpoint file holds a dict of

* ``format`` / ``format_version`` -- ``"tcl-checkpoint"`` / 1
* ``state_dict`` -- the model's tensors
* ``info_json`` -- one JSON string: ``kind``, ``n_features``, ``config`` (the ``tcl.models.nets.build_net``
  keyword arguments), ``feature_meta`` (featurizer version, max_len, n_features, vocab, ...),
  ``extra`` (anything JSON-able the caller adds: epoch, metrics, run id), ``torch_version``.
* ``aux_tensors`` -- optional: named tensors that travel with the weights but are not the net's
  (continual learning's EWC Fisher information and anchor, tcl.continual.ewc); older readers
  ignore the key.

Nothing is pickled: ``read_checkpoint`` returns the tensors and the info; the net is rebuilt
from them by ``tcl.models.nets.load_checkpoint`` (tensors loaded strictly).  Writes are atomic (temp file + rename, ``tcl.io.atomic_path``).
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch
from torch import nn

from tcl.io import atomic_path

FORMAT = "tcl-checkpoint"
FORMAT_VERSION = 1

__all__ = ["save_checkpoint", "read_checkpoint", "FORMAT", "FORMAT_VERSION"]


def _jsonable(obj: Any) -> Any:
    """JSON-safe copy; numpy scalars/arrays and paths are converted, anything else raises."""
    if obj is None or isinstance(obj, (bool, str)):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if isinstance(obj, float):
        return obj
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if hasattr(obj, "tolist") and type(obj).__module__.startswith("numpy"):
        return _jsonable(obj.tolist())
    if isinstance(obj, torch.Tensor) and obj.numel() == 1:
        return obj.item()
    raise TypeError(f"checkpoint metadata must be JSON-able; got {type(obj).__name__}: {obj!r:.80}")


def save_checkpoint(path: str | os.PathLike, model: nn.Module, kind: str, config: dict,
                    feature_meta: dict, extra: dict | None = None,
                    aux_tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Write `model` (a net built by ``build_net(kind, n_features, **config)``) to `path`
    atomically, with `aux_tensors` beside its weights."""
    n_features = getattr(model, "n_features", None)
    if n_features is None:
        n_features = (feature_meta or {}).get("n_features")
    if n_features is None:
        raise ValueError("n_features unknown: the model has no n_features and feature_meta lacks it")
    info = {
        "kind": str(kind),
        "n_features": int(n_features),
        "config": _jsonable(dict(config or {})),
        "feature_meta": _jsonable(dict(feature_meta or {})),
        "extra": _jsonable(dict(extra or {})),
        "torch_version": torch.__version__,
    }
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "info_json": json.dumps(info, sort_keys=True),
        "state_dict": state,
    }
    if aux_tensors:
        payload["aux_tensors"] = {str(k): v.detach().cpu().clone() for k, v in aux_tensors.items()}
    path = Path(path)
    with atomic_path(path, suffix=".pt") as tmp:
        torch.save(payload, tmp)
    return path


def read_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu"
                    ) -> tuple[dict, dict]:
    """(state_dict, info) of a checkpoint written by ``save_checkpoint``.

    info: kind, n_features, config, feature_meta, extra, torch_version, format_version, and
    ``aux_tensors`` (a dict of tensors, empty when the file has none).
    """
    if Path(path).suffix.lower() == ".onnx":
        raise ValueError(f"{path}: an ONNX export is what serving and `tcl tune --model` read; this "
                         f"needs the model's {FORMAT} (its model.pt, its training dir or a models:/ URI)")
    try:
        payload = torch.load(Path(path), map_location=map_location, weights_only=True)
    except pickle.UnpicklingError:
        # torch's own message suggests weights_only=False: TCL never unpickles code from a file
        raise ValueError(f"{path}: not a readable {FORMAT} file (not a torch file of tensors and plain "
                         "values; pickled objects are never loaded)") from None
    except Exception as exc:  # noqa: BLE001 - a zip/pickle error says little; name the file
        raise ValueError(f"{path}: not a readable {FORMAT} file ({type(exc).__name__}: {exc})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ValueError(f"{path} is not a {FORMAT} file")
    version = int(payload.get("format_version", 0))
    if version > FORMAT_VERSION:
        raise ValueError(f"{path}: checkpoint format {version} is newer than this tcl ({FORMAT_VERSION})")
    info = json.loads(payload["info_json"])
    info["format_version"] = version
    info["aux_tensors"] = dict(payload.get("aux_tensors") or {})
    return payload["state_dict"], info
