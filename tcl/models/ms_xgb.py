"""MetaSchedule's XGBoost cost model (`XGBModel` of `tvm.s_tir.meta_schedule`) on per-store
features: kind ``xgb-ms``.

The library's class does the learning, driven offline: `XGBModel._train(xs, ys)` and
`XGBModel._predict(xs)` take per-program feature arrays directly (its public `update`/`predict`
would re-extract them from schedules, which `tcl.perstore_extract` already did). So everything
that makes it MetaSchedule's model is MetaSchedule's code:

* features: the rows of `PerStoreFeature()`, its default extractor (no workload part): the
  first 164 columns of a `PerStoreSet` (`workload_features: true` adds the other 8);
* the pack-sum form: each store row is a DMatrix row labelled with its program's y and weighted
  by y; a program's score is the sum of its stores' scores;
* the objective: squared error of that sum against y, weighted by y (`PackSum.obj_square_error`);
* `XGBConfig` (max_depth 10, gamma 0.001, min_child_weight 0, eta 0.2, tree_method auto) and the
  stopping rule: up to 10,000 rounds, stopped 50 rounds after the training p-RMSE last fell.

The labels are TCL's y = min latency in the task / latency, which is XGBModel's
`min_cost / cost` per workload (it takes the median of the repeats; the records keep the mean).
`fit` retrains from scratch on the sets it is given, as `XGBModel.update` retrains on all data
it has seen; validation sets are only evaluated (MetaSchedule trains without one). What differs
is persistence: `XGBModel.save` tars a pickled object array of its training data; this saves
the booster alone as XGBoost JSON (``tcl.models.xgb.save_booster``, no pickle).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np

from tcl.models.base import PerStoreCostModel
from tcl.models.xgb import load_booster, save_booster
from tcl.perstore import N_FEATURES, flat_stores

KIND = "xgb-ms"
MODEL_FILE = "model.json"
DEFAULT_CONFIG = {"workload_features": False}  # + any XGBConfig field (max_depth, eta, ...) to override
CHUNK = 4096  # programs gathered from the padded inputs at a time


def _library_model(config: dict, n_threads: int, seed: int):
    """MetaSchedule's XGBModel with its default XGBConfig, `config` overriding fields by name."""
    from tvm.s_tir.meta_schedule.cost_model.xgb_model import XGBConfig, XGBModel

    fields = {k: v for k, v in config.items() if k in XGBConfig._fields}
    xgb_config = XGBConfig(**{"seed": seed, **fields, "nthread": n_threads})
    return XGBModel(config=xgb_config, **{k: config[k] for k in ("early_stopping_rounds",) if k in config})


class MSXGBModel(PerStoreCostModel):
    """MetaSchedule's XGBModel (pack-sum over a program's stores) behind the CostModel interface."""

    kind = KIND
    file_suffix = ".json"
    warm_start = False

    def __init__(self, n_features: int = N_FEATURES, config: dict | None = None,
                 feature_meta: dict | None = None, booster=None, n_threads: int = 2):
        super().__init__(n_features or N_FEATURES, {**DEFAULT_CONFIG, **(config or {})}, feature_meta)
        self.booster = booster
        self.n_threads = int(n_threads)

    def _programs(self, x, mask) -> list[np.ndarray]:
        """Padded (B, S, F) + mask -> each program's (stores, n_columns) rows."""
        counts, rows = flat_stores(x, mask)
        return np.split(rows[:, :self.n_columns], np.cumsum(counts)[:-1])

    # -- training -------------------------------------------------------------------------------
    def fit(self, train_sets, valid_sets, train_params, out_dir, run=None, progress=None,
            resume=True, trainable=None, extra_losses=None) -> list[dict]:
        """MetaSchedule's training on every program with stores and a finite label; one history
        record (the rounds boosted, seconds, validation metrics). Of `train_params` only seed
        and threads apply."""
        from tcl.training import DEFAULT_TRAIN, emit_metrics, feature_meta, validate, write_history

        if trainable is not None or extra_losses:
            raise ValueError(f"{self.kind} models take no parameter filter or extra loss terms")
        p = {**DEFAULT_TRAIN, **(train_params or {})}
        self.n_threads = int(p["threads"])
        self.feature_meta = {**self.feature_meta, **feature_meta(train_sets)}
        xs, ys = [], []
        for fs in train_sets:
            x, mask = self.inputs(fs)
            y = np.asarray(fs.y, np.float32)
            for a in range(0, len(fs), CHUNK):
                for program, label in zip(self._programs(x[a:a + CHUNK], mask[a:a + CHUNK]), y[a:a + CHUNK]):
                    if len(program) and np.isfinite(label):  # XGBModel.update drops programs without features too
                        xs.append(program)
                        ys.append(label)
        if not xs:
            raise ValueError("no program with per-store features to train on")

        start = time.perf_counter()
        library = _library_model(self.config, self.n_threads, int(p["seed"]))
        library._train(xs=xs, ys=np.asarray(ys, np.float32))
        self.booster = library.booster
        seconds = time.perf_counter() - start
        rounds = int(self.booster.num_boosted_rounds())
        final = {"epoch": rounds, "train_seconds": seconds,
                 "train_samples_per_s": len(xs) * rounds / max(seconds, 1e-9)}
        if valid_sets:
            final.update(validate(self, valid_sets, int(p["eval_batch_size"])))
        emit_metrics(run, rounds, final)
        out_dir = Path(out_dir)
        self.save(out_dir / MODEL_FILE)
        write_history(out_dir, [final])
        return [final]

    # -- inference ------------------------------------------------------------------------------
    def predict(self, x: np.ndarray, mask: np.ndarray, dropout: bool = False) -> np.ndarray:
        """The sum of the booster's scores of each program's stores; -inf for one without stores."""
        if self.booster is None:
            raise RuntimeError("model is not trained or loaded")
        programs = self._programs(x, mask)
        have = [i for i, rows in enumerate(programs) if len(rows)]
        scores = np.full(len(programs), -np.inf)
        if have:
            library = _library_model(self.config, self.n_threads, 0)
            library.booster = self.booster
            scores[have] = library._predict(xs=[programs[i] for i in have])
        return scores

    def embed(self, x: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """The sum of each program's store rows (N, n_columns): the pack the trees' scores add over."""
        m = np.asarray(mask, dtype=bool)[..., None]
        return (np.asarray(x)[..., :self.n_columns] * m).sum(axis=1).astype(np.float32)

    # -- persistence ----------------------------------------------------------------------------
    def save(self, path: str | os.PathLike, extra: dict | None = None) -> Path:
        return save_booster(self, path, extra)

    @classmethod
    def load(cls, path: str | os.PathLike, n_threads: int = 2) -> "MSXGBModel":
        return load_booster(cls, path, n_threads)
