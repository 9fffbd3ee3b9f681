"""MetaSchedule's XGBoost cost model (`XGBModel` of `tvm.s_tir.meta_schedule`) on per-store features.

The library's class does the learning, driven offline: `XGBModel._train(xs, ys)` and
`XGBModel._predict(xs)` take per-program feature arrays directly (its public `update`/`predict`
would re-extract them from schedules, which `tcl.perstore` already did). So everything that
makes it MetaSchedule's model is MetaSchedule's code:

* features: the rows of `PerStoreFeature()`, its default extractor (no workload part): the
  first 164 columns of a `PerStoreSet` (`workload_features: true` adds the other 8);
* the pack-sum form: each store row is a DMatrix row labelled with its program's y and weighted
  by y; a program's score is the sum of its stores' scores;
* the objective: squared error of that sum against y, weighted by y (`PackSum.obj_square_error`);
* `XGBConfig` (max_depth 10, gamma 0.001, min_child_weight 0, eta 0.2, tree_method auto) and the
  stopping rule: up to 10,000 rounds, stopped 50 rounds after the training p-RMSE last fell.

The labels are TCL's y = min latency in the task / latency, which is XGBModel's
`min_cost / cost` per workload (it takes the median of the repeats; the records keep the mean).
Validation sets are only evaluated (MetaSchedule trains without one). What differs is
persistence: `XGBModel.save` tars a pickled object array of its training data; this saves the
booster alone as XGBoost JSON, kind and config inside as attributes (no pickle).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

KIND = "xgb-ms"
DEFAULT_CONFIG = {"workload_features": False}  # + any XGBConfig field (max_depth, eta, ...) to override


def _library_model(config: dict, n_threads: int, seed: int):
    """MetaSchedule's XGBModel with its default XGBConfig, `config` overriding fields by name."""
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig, XGBModel

    fields = {k: v for k, v in config.items() if k in XGBConfig._fields}
    xgb_config = XGBConfig(**{"seed": seed, **fields, "nthread": n_threads})
    return XGBModel(config=xgb_config, **{k: config[k] for k in ("early_stopping_rounds",) if k in config})


@dataclass
class MSXGBCostModel:
    config: dict = field(default_factory=lambda: dict(DEFAULT_CONFIG))
    feature_meta: dict = field(default_factory=dict)
    booster: object = None
    n_threads: int = 2

    kind = KIND

    def _columns(self, ps) -> int:
        n = int(ps.meta.get("n_store_features", 164))
        return int(ps.stores.shape[1]) if {**DEFAULT_CONFIG, **self.config}["workload_features"] else n

    def _programs(self, ps) -> list[np.ndarray]:
        cols = self._columns(ps)
        return [ps.stores[a:b, :cols] for a, b in zip(ps.offsets[:-1], ps.offsets[1:])]

    def fit(self, train_sets, seed: int = 0) -> int:
        """Train on PerStoreSets (one per platform); returns the number of boosting rounds."""
        xs, ys = [], []
        for ps in train_sets:
            for x, y in zip(self._programs(ps), np.asarray(ps.y, np.float32)):
                if len(x) and np.isfinite(y):  # XGBModel.update drops programs without features too
                    xs.append(x)
                    ys.append(y)
        if not xs:
            raise ValueError("no program with per-store features to train on")
        model = _library_model(self.config, self.n_threads, seed)
        model._train(xs=xs, ys=np.asarray(ys, np.float32))
        self.booster = model.booster
        return int(self.booster.num_boosted_rounds())

    def predict(self, ps) -> np.ndarray:
        """Scores (higher = faster) of every program of a PerStoreSet; -inf for one without stores."""
        if self.booster is None:
            raise RuntimeError("model is not trained or loaded")
        xs = self._programs(ps)
        have = [i for i, x in enumerate(xs) if len(x)]
        scores = np.full(len(xs), -np.inf)
        if have:
            model = _library_model(self.config, self.n_threads, 0)
            model.booster = self.booster
            scores[have] = model._predict(xs=[xs[i] for i in have])
        return scores

    def save(self, path: str | os.PathLike) -> Path:
        from tcl.io import atomic_path

        if self.booster is None:
            raise RuntimeError("nothing to save: model is not trained")
        path = Path(path)
        if path.suffix != ".json":
            raise ValueError(f"XGBoost models are saved as .json, got {path}")
        self.booster.set_attr(tcl_kind=KIND, tcl_config=json.dumps(self.config, sort_keys=True),
                              tcl_feature_meta=json.dumps(self.feature_meta, sort_keys=True, default=str))
        with atomic_path(path, suffix=".json") as tmp:
            self.booster.save_model(str(tmp))
        return path

    @classmethod
    def load(cls, path: str | os.PathLike, n_threads: int = 2) -> "MSXGBCostModel":
        import xgboost as xgb

        booster = xgb.Booster()
        booster.load_model(str(path))
        if booster.attr("tcl_kind") != KIND:
            raise ValueError(f"{path} is not a {KIND} model (tcl_kind is {booster.attr('tcl_kind')!r})")
        booster.set_param({"nthread": n_threads})
        return cls(config=json.loads(booster.attr("tcl_config") or "{}"),
                   feature_meta=json.loads(booster.attr("tcl_feature_meta") or "{}"),
                   booster=booster, n_threads=n_threads)

    @property
    def info(self) -> dict:
        return {"kind": KIND, "config": self.config, "feature_meta": self.feature_meta}


def train(train_sets, valid_sets, config: dict, p: dict, out_dir: Path, run=None):
    """`tcl.training.train_model` for this kind: fit, evaluate on the validation sets, save model.json."""
    import time

    from tcl.io import atomic_write_json
    from tcl.training import HISTORY_FILE, XGB_FILE, _emit, _feature_meta, validate

    model = MSXGBCostModel(config=dict(config or {}), feature_meta=_feature_meta(train_sets),
                           n_threads=int(p["threads"]))
    start = time.perf_counter()
    rounds = model.fit(train_sets, seed=int(p["seed"]))
    seconds = time.perf_counter() - start
    final = {"epoch": rounds, "train_seconds": seconds,
             "train_samples_per_s": sum(len(ps) for ps in train_sets) * rounds / max(seconds, 1e-9)}
    if valid_sets:
        final.update(validate(model, valid_sets, int(p["eval_batch_size"])))
    _emit(run, rounds, final)
    model.save(out_dir / XGB_FILE)
    atomic_write_json(out_dir / HISTORY_FILE, [final])
    return model, [final]
