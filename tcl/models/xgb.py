"""XGBoost baseline (MetaSchedule's default cost-model family) on pooled step features.

A program's (L, F) step sequence with its mask is pooled to one vector:
`[masked sum of rows (F), masked mean of rows (F), number of steps (1)]`. Pooling loses the
order of the primitives, which is exactly what the sequence models are meant to exploit.

Objective: `rank:pairwise` with one query group per task (default), or `reg:squarederror` on y.
Saved with XGBoost's own JSON format (no pickle); the model kind, config and feature metadata
travel inside the JSON as booster attributes, so one file is the whole checkpoint.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DEFAULT_CONFIG = {"n_estimators": 200, "max_depth": 8, "eta": 0.2, "objective": "rank:pairwise"}
KIND = "xgb"


def pool_features(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(N, L, F) + (N, L) bool -> (N, 2F + 1): masked sum, masked mean, length."""
    x = np.asarray(x, dtype=np.float32)
    m = np.asarray(mask, dtype=bool)[..., None].astype(np.float32)
    total = (x * m).sum(axis=1)
    length = m.sum(axis=1)
    mean = total / np.maximum(length, 1.0)
    return np.concatenate([total, mean, length], axis=1).astype(np.float32)


@dataclass
class XGBCostModel:
    config: dict = field(default_factory=lambda: dict(DEFAULT_CONFIG))
    feature_meta: dict = field(default_factory=dict)
    booster: object = None
    n_threads: int = 2

    kind = KIND

    # -- training -------------------------------------------------------------------------------
    def _params(self) -> dict:
        cfg = {**DEFAULT_CONFIG, **self.config}
        params = {
            "objective": cfg["objective"],
            "max_depth": int(cfg["max_depth"]),
            "eta": float(cfg["eta"]),
            "nthread": self.n_threads,
            "tree_method": cfg.get("tree_method", "hist"),
            "seed": int(cfg.get("seed", 0)),
            "eval_metric": cfg.get("eval_metric", "ndcg@5" if cfg["objective"].startswith("rank:") else "rmse"),
        }
        if cfg["objective"].startswith("rank:"):
            params["ndcg_exp_gain"] = False  # y is a real number in (0, 1], not an integer grade
        for key in ("subsample", "colsample_bytree", "min_child_weight", "lambda", "alpha"):
            if key in cfg:
                params[key] = cfg[key]
        return params

    def _dmatrix(self, fs):
        import xgboost as xgb

        objective = {**DEFAULT_CONFIG, **self.config}["objective"]
        y = np.asarray(fs.y, dtype=np.float32)
        keep = np.isfinite(y)
        rows = np.flatnonzero(keep)
        if objective.startswith("rank:"):
            rows = rows[np.argsort(np.asarray(fs.task)[rows], kind="stable")]  # groups must be contiguous
        feats = pool_features(np.asarray(fs.x)[rows], np.asarray(fs.mask)[rows])
        d = xgb.DMatrix(feats, label=y[rows], nthread=self.n_threads)
        if objective.startswith("rank:"):
            _, counts = np.unique(np.asarray(fs.task)[rows], return_counts=True)
            d.set_group(counts)
        return d

    def fit(self, train_sets, valid_sets=None, on_round=None, early_stopping_rounds: int | None = None):
        """Train on one FeatureSet or a list (one per platform; groups never mix platforms)."""
        import xgboost as xgb

        train_sets = train_sets if isinstance(train_sets, (list, tuple)) else [train_sets]
        valid_sets = [] if valid_sets is None else (valid_sets if isinstance(valid_sets, (list, tuple)) else [valid_sets])
        dtrain = self._dmatrix(_concat(train_sets))
        evals = [(dtrain, "train")]
        if valid_sets:
            evals.append((self._dmatrix(_concat(valid_sets)), "valid"))
        callbacks = []
        if on_round is not None:
            callbacks.append(_round_callback(on_round))
        n_rounds = int({**DEFAULT_CONFIG, **self.config}["n_estimators"])
        history: dict = {}
        self.booster = xgb.train(
            self._params(), dtrain, num_boost_round=n_rounds, evals=evals, evals_result=history,
            verbose_eval=False, callbacks=callbacks,
            early_stopping_rounds=early_stopping_rounds if valid_sets else None,
        )
        return history

    # -- inference ------------------------------------------------------------------------------
    def predict_arrays(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        import xgboost as xgb

        if self.booster is None:
            raise RuntimeError("model is not trained or loaded")
        d = xgb.DMatrix(pool_features(x, mask), nthread=self.n_threads)
        kwargs = {}
        best = self.booster.attr("best_iteration")  # set by early stopping: predict with the best trees
        if best is not None:
            kwargs["iteration_range"] = (0, int(best) + 1)
        return np.asarray(self.booster.predict(d, **kwargs), dtype=np.float64)

    def predict(self, fs) -> np.ndarray:
        """Scores for every program of a FeatureSet (higher = predicted faster)."""
        return self.predict_arrays(fs.x, fs.mask)

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike) -> Path:
        """Write the booster as XGBoost JSON (atomic), with kind/config/feature_meta as attributes."""
        from tcl.io import atomic_path

        if self.booster is None:
            raise RuntimeError("nothing to save: model is not trained")
        path = Path(path)
        if path.suffix != ".json":
            raise ValueError(f"XGBoost models are saved as .json, got {path}")
        self.booster.set_attr(
            tcl_kind=KIND,
            tcl_config=json.dumps(self.config, sort_keys=True),
            tcl_feature_meta=json.dumps(_jsonable(self.feature_meta), sort_keys=True),
        )
        with atomic_path(path, suffix=".json") as tmp:
            self.booster.save_model(str(tmp))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, n_threads: int = 2) -> "XGBCostModel":
        import xgboost as xgb

        booster = xgb.Booster()
        booster.load_model(str(path))
        if booster.attr("tcl_kind") != KIND:
            raise ValueError(f"{path} is not a TCL XGBoost model (missing tcl_kind attribute)")
        booster.set_param({"nthread": n_threads})
        return cls(
            config=json.loads(booster.attr("tcl_config") or "{}"),
            feature_meta=json.loads(booster.attr("tcl_feature_meta") or "{}"),
            booster=booster,
            n_threads=n_threads,
        )

    @property
    def info(self) -> dict:
        return {"kind": KIND, "config": self.config, "feature_meta": self.feature_meta}


def _round_callback(fn):
    """An XGBoost callback forwarding each round's eval results to `fn(round, {data_metric: value})`."""
    import xgboost as xgb

    class _Forward(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):
            # "ndcg@5" -> "ndcg_at5": MLflow metric names allow no "@"
            fn(epoch, {f"{d}_{m}".replace("@", "_at"): float(v[-1]) for d, ms in evals_log.items() for m, v in ms.items()})
            return False  # never stop training

    return _Forward()


def _concat(sets):
    """Stack several FeatureSets' x/mask/y/task (task ids offset so tasks of platforms never merge)."""
    if len(sets) == 1:
        return sets[0]

    class _Stacked:
        pass

    out = _Stacked()
    L = max(s.x.shape[1] for s in sets)
    xs, ms = [], []
    for s in sets:
        pad = L - s.x.shape[1]
        xs.append(np.pad(s.x, ((0, 0), (0, pad), (0, 0))))
        ms.append(np.pad(s.mask, ((0, 0), (0, pad))))
    out.x, out.mask = np.concatenate(xs), np.concatenate(ms)
    out.y = np.concatenate([s.y for s in sets])
    offsets = np.cumsum([0] + [int(np.max(s.task)) + 1 if len(s.task) else 0 for s in sets[:-1]])
    out.task = np.concatenate([np.asarray(s.task, dtype=np.int64) + o for s, o in zip(sets, offsets)])
    return out


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return obj
