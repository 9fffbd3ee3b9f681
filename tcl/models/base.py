"""The cost-model interface every model kind implements (the shape of MetaSchedule's ``CostModel``).

    model = tcl.models.new_model("mamba", n_features, config, feature_meta)
    history = model.fit(train_sets, valid_sets, train_params, out_dir)
    scores = model.predict(x, mask)          # (N,) float64, higher = predicted faster
    z = model.embed(x, mask)                 # (N, D) pooled representation (for sampling)
    model.save(path); tcl.models.load_model(path)

Callers (training jobs, evaluation, benchmarks, export, the CLI) hold a ``CostModel`` and never
ask which kind it is. A kind names the arrays of a feature set it reads in ``inputs``: the
step-sequence kinds read ``(fs.x, fs.mask)`` of a FeatureSet (``<name>.npz``); the per-store
kinds (``xgb-ms``, ``mlp-tenset``) read a PerStoreSet (``<name>.perstore.npz``, tcl.perstore)
as its store rows zero-padded per program, ``(x (N, S, 172), mask (N, S))``. Both kinds of set
carry the same labels, so training, evaluation and metrics take either; handed the other kind,
``inputs`` raises ``tcl.features.FeatureKindError``.
"""

from __future__ import annotations

import abc
import os
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

# extra loss term: fn(batch, scores, model) -> scalar tensor (see tcl.training.fit_net)
LossTerm = Callable[..., object]
# parameter filter: fn(name, parameter) -> True to train it, False to keep it frozen
ParamFilter = Callable[[str, object], bool]


class CostModel(abc.ABC):
    """A cost model of one kind: scores programs, pools them to embeddings, trains, persists."""

    kind: str = ""                 # the registry name (tcl.models.KINDS)
    default_preset: str | None = None  # params.yaml models.<kind>.<preset> used when none is given
    file_suffix: str = ".pt"       # what `save` writes
    onnx_export: bool = False      # `to_onnx` is implemented (served by tcl.serving)
    warm_start: bool = True        # `fit` continues from the current weights (False: it retrains
                                   # from scratch, as the baselines' own training does)

    def __init__(self, n_features: int, config: dict | None = None, feature_meta: dict | None = None):
        self.n_features = int(n_features)
        self.config = dict(config or {})
        self.feature_meta = dict(feature_meta or {})
        self.extra: dict = {}  # what the saved file carried besides the weights (epoch, metrics)

    # -- data -----------------------------------------------------------------------------
    @classmethod
    def inputs(cls, fs) -> tuple[np.ndarray, np.ndarray]:
        """The arrays of a FeatureSet this kind reads: (x (N, L, F), mask (N, L))."""
        from tcl.features import FeatureKindError

        if not hasattr(fs, "x"):  # e.g. a tcl.perstore.PerStoreSet
            raise FeatureKindError(f"model kind {cls.kind!r} reads step-sequence features (.npz), not "
                                   f"{type(fs).__name__} of platform {fs.platform!r}")
        return fs.x, fs.mask

    def check_features(self, fs, source: str = "") -> None:
        """FeatureKindError unless `fs` holds features this model reads: its kind (``inputs``) and,
        for step sequences, what ``check_step_features`` compares. `source` (a file name) leads
        the message."""
        from tcl.features import FeatureKindError

        try:
            self.inputs(fs)
            if hasattr(fs, "x"):
                self.check_step_features(dict(getattr(fs, "meta", None) or {}), int(fs.x.shape[2]))
        except FeatureKindError as exc:
            raise FeatureKindError(f"{source}: {exc}" if source else str(exc)) from None

    def check_step_features(self, meta: dict, width: int) -> None:
        """FeatureKindError unless step features of `width` made as `meta` records (a FeatureSet's
        or a Featurizer's meta) are those this model was trained on: the width, and the featurizer
        version and vocabulary, each compared where both sides record it."""
        from tcl.features import FeatureKindError, features_vocab_hash

        mine = self.feature_meta
        if int(width) != self.n_features:
            raise FeatureKindError(f"{width} features per step; the model reads {self.n_features} "
                                   "(featurized with another vocabulary or version)")
        mv, tv = str(mine.get("feature_version") or ""), str(meta.get("feature_version") or "")
        if mv and tv and mv != tv:
            raise FeatureKindError(f"features of version {tv!r}; the model was trained on {mv!r}: "
                                   "re-featurize them with this tcl")
        mh, th = features_vocab_hash(mine), features_vocab_hash(meta)
        if mh and th and mh != th:
            raise FeatureKindError("featurizer vocabulary differs from the one the model was trained "
                                   "with (vocab_hash mismatch)")

    # -- inference ------------------------------------------------------------------------
    @abc.abstractmethod
    def predict(self, x: np.ndarray, mask: np.ndarray, dropout: bool | float = False) -> np.ndarray:
        """Scores (N,) float64, higher = predicted faster. `dropout`: keep dropout on (one
        MC-dropout sample); a rate in (0, 1) also runs the dropout layers trained at 0 at that rate
        (a model trained without dropout then gives MC samples too); kinds without dropout ignore it."""

    @abc.abstractmethod
    def embed(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The pooled representation (N, D) float32 the score is read from."""

    def predict_features(self, fs, batch_size: int = 4096, dropout: bool = False) -> np.ndarray:
        """Scores for every program of a FeatureSet, `batch_size` rows at a time."""
        x, mask = self.inputs(fs)
        out = [self.predict(x[a:a + batch_size], mask[a:a + batch_size], dropout=dropout)
               for a in range(0, len(fs), batch_size)]
        return np.concatenate(out).astype(np.float64) if out else np.zeros(0)

    def embed_features(self, fs, batch_size: int = 4096) -> np.ndarray:
        x, mask = self.inputs(fs)
        out = [self.embed(x[a:a + batch_size], mask[a:a + batch_size])
               for a in range(0, len(fs), batch_size)]
        return np.concatenate(out) if out else np.zeros((0, 0), dtype=np.float32)

    # -- training -------------------------------------------------------------------------
    @abc.abstractmethod
    def fit(self, train_sets: Sequence, valid_sets: Sequence, train_params: dict,
            out_dir: str | os.PathLike, run=None, progress: bool | None = None,
            resume: bool = True, trainable: ParamFilter | None = None,
            extra_losses: dict[str, LossTerm] | None = None) -> list[dict]:
        """Train on FeatureSets (one per platform; batches never mix platforms), starting from
        the current weights; keep the best validation weights. Writes ``out_dir/<model file>``
        and ``history.json``; returns the per-epoch history. `trainable` and `extra_losses`
        apply to gradient-trained kinds (others raise if given)."""

    # -- persistence ----------------------------------------------------------------------
    @abc.abstractmethod
    def save(self, path: str | os.PathLike, extra: dict | None = None) -> Path:
        """Write the model (atomically) so that `load` restores identical predictions."""

    @classmethod
    @abc.abstractmethod
    def load(cls, path: str | os.PathLike) -> "CostModel":
        """The model written by `save`."""

    @property
    def info(self) -> dict:
        return {"kind": self.kind, "n_features": self.n_features, "config": self.config,
                "feature_meta": self.feature_meta}

    def to_onnx(self, max_len: int, opset: int = 17) -> bytes:
        """ONNX bytes with inputs ``x``/``mask`` and output ``score`` (dynamic batch/length)."""
        raise NotImplementedError(f"{self.kind} models have no ONNX export")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_features={self.n_features}, config={self.config})"


class PerStoreCostModel(CostModel):
    """A kind over MetaSchedule's per-store features (tcl.perstore): it reads a PerStoreSet as its
    padded store rows, of which the first 164 columns (MetaSchedule's default extractor), or all
    172 with the workload part (config ``workload_features``)."""

    @classmethod
    def inputs(cls, fs):
        from tcl.perstore import per_store_inputs

        return per_store_inputs(fs, cls.kind)

    @property
    def n_columns(self) -> int:
        """The columns of each store row the model reads."""
        from tcl.perstore import N_STORE_FEATURES

        return self.n_features if self.config["workload_features"] else min(N_STORE_FEATURES, self.n_features)
