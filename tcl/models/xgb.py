"""XGBoost baseline (MetaSchedule's default cost-model family) on pooled step features.

A program's (L, F) step sequence with its mask is pooled to one vector:
`[masked sum of rows (F), masked mean of rows (F), number of steps (1)]`. Pooling loses the
order of the primitives, which is exactly what the sequence models are meant to exploit.

Objective: `rank:pairwise` with one query group per task (default), or `reg:squarederror` on y.
Saved with XGBoost's own JSON format (no pickle); the model kind, config and feature metadata
travel inside the JSON as booster attributes, so one file is the whole checkpoint. A warm start
(``fit`` on a loaded model) adds rounds to the loaded trees.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from tcl.models.base import CostModel

DEFAULT_CONFIG = {"n_estimators": 200, "max_depth": 8, "eta": 0.2, "objective": "rank:pairwise"}
KIND = "xgb"
MODEL_FILE = "model.json"


def pool_features(x: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(N, L, F) + (N, L) bool -> (N, 2F + 1): masked sum, masked mean, length."""
    x = np.asarray(x, dtype=np.float32)
    m = np.asarray(mask, dtype=bool)[..., None].astype(np.float32)
    total = (x * m).sum(axis=1)
    length = m.sum(axis=1)
    mean = total / np.maximum(length, 1.0)
    return np.concatenate([total, mean, length], axis=1).astype(np.float32)


class XGBModel(CostModel):
    """Gradient-boosted trees on pooled step features (``pool_features``)."""

    kind = KIND
    file_suffix = ".json"

    def __init__(self, n_features: int = 0, config: dict | None = None, feature_meta: dict | None = None,
                 booster=None, n_threads: int = 2):
        super().__init__(n_features or int((feature_meta or {}).get("n_features", 0)),
                         {**DEFAULT_CONFIG, **(config or {})}, feature_meta)
        self.booster = booster
        self.n_threads = int(n_threads)

    # -- training -------------------------------------------------------------------------------
    def _params(self) -> dict:
        cfg = self.config
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

    def _dmatrix(self, sets):
        """One DMatrix of several FeatureSets (task ids offset so tasks of platforms never merge)."""
        import xgboost as xgb

        ranking = self.config["objective"].startswith("rank:")
        feats, labels, groups, offset = [], [], [], 0
        for fs in sets:
            x, mask = self.inputs(fs)
            y = np.asarray(fs.y, dtype=np.float32)
            task = np.asarray(fs.task, dtype=np.int64)
            rows = np.flatnonzero(np.isfinite(y))
            if ranking:
                rows = rows[np.argsort(task[rows], kind="stable")]  # groups must be contiguous
            feats.append(pool_features(np.asarray(x)[rows], np.asarray(mask)[rows]))
            labels.append(y[rows])
            groups.append(task[rows] + offset)
            offset += int(task.max()) + 1 if len(task) else 0
        d = xgb.DMatrix(np.concatenate(feats), label=np.concatenate(labels), nthread=self.n_threads)
        if ranking:
            _, counts = np.unique(np.concatenate(groups), return_counts=True)
            d.set_group(counts)
        return d

    def boost(self, train_sets, valid_sets=(), on_round=None, early_stopping_rounds: int | None = None) -> dict:
        """``config.n_estimators`` boosting rounds on top of the current trees (none: from scratch);
        `on_round(round, {data_metric: value})` after each."""
        import xgboost as xgb

        dtrain = self._dmatrix(train_sets)
        evals = [(dtrain, "train")]
        if valid_sets:
            evals.append((self._dmatrix(valid_sets), "valid"))
        callbacks = [_round_callback(on_round)] if on_round is not None else []
        history: dict = {}
        self.booster = xgb.train(
            self._params(), dtrain, num_boost_round=int(self.config["n_estimators"]), evals=evals,
            evals_result=history, verbose_eval=False, callbacks=callbacks, xgb_model=self.booster,
            early_stopping_rounds=early_stopping_rounds if valid_sets else None,
        )
        return history

    def fit(self, train_sets, valid_sets, train_params, out_dir, run=None, progress=None,
            resume=True, trainable=None, extra_losses=None) -> list[dict]:
        """Boosting rounds play the role of epochs: each round's eval metrics go to `run`; early
        stopping after ``patience * 5`` rounds without a better validation NDCG@5."""
        from tcl.training import DEFAULT_TRAIN, emit_metrics, feature_meta, validate, write_history

        if trainable is not None or extra_losses:
            raise ValueError("xgb models take no parameter filter or extra loss terms")
        p = {**DEFAULT_TRAIN, **(train_params or {})}
        self.config.setdefault("seed", int(p["seed"]))
        self.n_threads = int(p["threads"])
        self.feature_meta = {**self.feature_meta, **feature_meta(train_sets)}
        history: list[dict] = []

        def on_round(i, values):
            history.append({"epoch": i, **values})
            emit_metrics(run, i, values)

        t0 = time.perf_counter()
        self.boost(train_sets, valid_sets, on_round=on_round,
                   early_stopping_rounds=int(p["patience"]) * 5 if valid_sets else None)
        seconds = time.perf_counter() - t0
        final = {"epoch": len(history), "train_seconds": seconds,
                 "train_samples_per_s": sum(len(fs) for fs in train_sets) * len(history) / max(seconds, 1e-9)}
        if valid_sets:
            final.update(validate(self, valid_sets, int(p["eval_batch_size"])))
        history.append(final)
        out_dir = Path(out_dir)
        self.save(out_dir / MODEL_FILE)
        write_history(out_dir, history)
        return history

    # -- inference ------------------------------------------------------------------------------
    def predict(self, x: np.ndarray, mask: np.ndarray, dropout: bool = False) -> np.ndarray:
        import xgboost as xgb

        if self.booster is None:
            raise RuntimeError("model is not trained or loaded")
        d = xgb.DMatrix(pool_features(x, mask), nthread=self.n_threads)
        kwargs = {}
        best = self.booster.attr("best_iteration")  # set by early stopping: predict with the best trees
        if best is not None:
            kwargs["iteration_range"] = (0, int(best) + 1)
        return np.asarray(self.booster.predict(d, **kwargs), dtype=np.float64)

    def embed(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The pooled step features the trees split on (N, 2F + 1)."""
        return pool_features(x, mask)

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, extra: dict | None = None) -> Path:
        """Write the booster as XGBoost JSON (atomic), with kind/config/feature_meta as attributes."""
        return save_booster(self, path, extra)

    @classmethod
    def load(cls, path: str | os.PathLike, n_threads: int = 2) -> "XGBModel":
        return load_booster(cls, path, n_threads)


def save_booster(model, path: str | os.PathLike, extra: dict | None = None) -> Path:
    """Write `model.booster` as XGBoost JSON (atomically), the model's kind, n_features, config,
    feature_meta and extra inside as booster attributes: one file is the whole checkpoint."""
    from tcl.io import atomic_path

    if model.booster is None:
        raise RuntimeError("nothing to save: model is not trained")
    path = Path(path)
    if path.suffix != ".json":
        raise ValueError(f"XGBoost models are saved as .json, got {path}")
    model.booster.set_attr(
        tcl_kind=model.kind,
        tcl_n_features=str(model.n_features),
        tcl_config=json.dumps(_jsonable(model.config), sort_keys=True),
        tcl_feature_meta=json.dumps(_jsonable(model.feature_meta), sort_keys=True),
        tcl_extra=json.dumps(_jsonable({**model.extra, **(extra or {})}), sort_keys=True),
    )
    with atomic_path(path, suffix=".json") as tmp:
        model.booster.save_model(str(tmp))
    return path


def load_booster(cls, path: str | os.PathLike, n_threads: int = 2):
    """The `cls` model (constructed as ``cls(n_features, config=, feature_meta=, booster=,
    n_threads=)``) that `save_booster` wrote to `path`; ValueError for another kind or file."""
    import xgboost as xgb

    booster = xgb.Booster()
    try:
        booster.load_model(str(path))
    except xgb.core.XGBoostError as exc:
        raise ValueError(f"{path}: not an XGBoost model file ({str(exc).splitlines()[0]})") from None
    if booster.attr("tcl_kind") != cls.kind:
        raise ValueError(f"{path} is not a TCL {cls.kind} model (tcl_kind attribute "
                         f"{booster.attr('tcl_kind')!r})")
    booster.set_param({"nthread": n_threads})
    model = cls(int(booster.attr("tcl_n_features") or 0),
                config=json.loads(booster.attr("tcl_config") or "{}"),
                feature_meta=json.loads(booster.attr("tcl_feature_meta") or "{}"),
                booster=booster, n_threads=n_threads)
    model.extra = json.loads(booster.attr("tcl_extra") or "{}")
    return model


def _round_callback(fn):
    """An XGBoost callback forwarding each round's eval results to `fn(round, {data_metric: value})`."""
    import xgboost as xgb

    class _Forward(xgb.callback.TrainingCallback):
        def after_iteration(self, model, epoch, evals_log):
            # "ndcg@5" -> "ndcg_at5": MLflow metric names allow no "@"
            fn(epoch, {f"{d}_{m}".replace("@", "_at"): float(v[-1]) for d, ms in evals_log.items() for m, v in ms.items()})
            return False  # never stop training

    return _Forward()


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
