"""The peers `tcl tune --cost-model` compares the KB with, as MetaSchedule cost models.

- ``xgb``: MetaSchedule's own XGBModel (per-store features, learning online from the run's
  measurements; random scores until it has 100 of them, its default).
- ``random``: MetaSchedule's RandomModel.
- ``mlp``: the offline-trained Tenset-MLP of the comparison pipeline (kind ``mlp-tenset``,
  tcl.models.tenset_mlp) reading MetaSchedule's per-store features with the workload part, as it
  was trained (tcl.perstore); it does not learn during the run. It needs torch in the tuner's
  process (the KB does not).
"""

from __future__ import annotations

import os
import time

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.cost_model import PyCostModel

from tcl.tuner.cost_model import PredictStats, positive_scores

COST_MODELS = ("tcl", "xgb", "mlp", "random")


@derived_object
class TensetMLPCostModel(PyCostModel):
    """A trained ``mlp-tenset`` model (a file or training directory) scoring candidates."""

    def __init__(self, model_path: str | os.PathLike):
        super().__init__()
        from tvm.s_tir.meta_schedule.feature_extractor import PerStoreFeature

        from tcl.models import load_model

        self.model = load_model(model_path)
        if self.model.kind != "mlp-tenset":
            raise ValueError(f"{model_path}: a {self.model.kind} model; --cost-model mlp takes an "
                             "mlp-tenset model (tcl train --model mlp-tenset)")
        workload = bool(self.model.config.get("workload_features", True))
        self.extractor = PerStoreFeature(extract_workload=workload)
        self.stats = PredictStats()

    def load(self, path: str) -> None:
        raise NotImplementedError("the Tenset-MLP is loaded when constructed")

    def save(self, path: str) -> None:
        raise NotImplementedError("the Tenset-MLP is trained offline; nothing to save")

    def update(self, context, candidates, results) -> None:
        self.stats.measured += len(candidates)  # trained offline: Tenset's transfer setting

    def predict(self, context, candidates) -> np.ndarray:
        start = time.perf_counter()
        rows = [f.numpy() for f in self.extractor.extract_from(context, candidates)]
        t1 = time.perf_counter()
        n, width = len(rows), self.model.n_features
        most = max((len(r) for r in rows), default=1) or 1
        x = np.zeros((n, most, width), np.float32)
        mask = np.zeros((n, most), bool)
        for i, r in enumerate(rows):
            x[i, :len(r), :r.shape[1]] = r
            mask[i, :len(r)] = True
        t2 = time.perf_counter()
        raw = self.model.predict(x, mask) if n else np.zeros(0)
        t3 = time.perf_counter()
        st = self.stats
        st.predict_calls += 1
        st.candidates_scored += n
        st.steps_seconds += t1 - start
        st.features_seconds += t2 - t1
        st.score_seconds += t3 - t2
        st.predict_seconds += t3 - start
        return positive_scores(raw)  # the KB's fixed increasing map: MetaSchedule wants scores >= 0


@derived_object
class CountedCostModel(PyCostModel):
    """One of MetaSchedule's own cost models (XGBoost, random), unchanged, with its predict calls
    counted and timed as TCL's are (PredictStats): `tcl tune` reports them for every model, and
    the study compares what each model's scoring costs inside the same search."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner
        self.stats = PredictStats()

    def load(self, path: str) -> None:
        self.inner.load(path)

    def save(self, path: str) -> None:
        self.inner.save(path)

    def update(self, context, candidates, results) -> None:
        self.stats.measured += len(candidates)
        self.inner.update(context, candidates, results)

    def predict(self, context, candidates) -> np.ndarray:
        start = time.perf_counter()
        out = np.asarray(self.inner.predict(context, candidates), np.float64)
        st = self.stats
        st.predict_calls += 1
        st.candidates_scored += len(candidates)
        st.predict_seconds += time.perf_counter() - start
        return out


def make_cost_model(kind: str, model: str | None, family: str | None, seed: int, threads: int,
                    fine_tune: bool = False, fine_tune_settings: dict | None = None, explore: dict | None = None,
                    online: dict | None = None):
    """(the MetaSchedule cost model, its PredictStats or None) for `kind` in COST_MODELS;
    `fine_tune`: the KB learns from the run's measurements (tcl only), with `fine_tune_settings`
    over `tcl.tuner.fine_tune.fine_tune_params()`'s; `explore`: the KB's evidence-following
    exploration (tcl only; complete settings, `tcl.tuner.explore.explore_for()`); `online`:
    XGBoost learning beside the KB (tcl only; `tcl.tuner.online.online_for()`)."""
    from tvm.s_tir import meta_schedule as ms

    if kind == "tcl":
        from tcl.tuner.cost_model import TCLCostModel

        if not model:  # tcl.tuner.tune.tune resolves the family's registered KB
            raise ValueError("--cost-model tcl needs a KB: a models:/ URI, an .onnx file or a checkpoint")
        cm = TCLCostModel(model, family=family, threads=threads, fine_tune=fine_tune,
                          fine_tune_params=fine_tune_settings, explore=explore, seed=seed, online=online)
        return cm, cm.stats
    if fine_tune:
        raise ValueError(f"--fine-tune is for --cost-model tcl ({kind} {'learns online' if kind == 'xgb' else 'does not learn'})")
    if kind == "mlp":
        if not model:
            raise ValueError("--cost-model mlp needs --model: a trained mlp-tenset model (file or directory)")
        cm = TensetMLPCostModel(model)
        return cm, cm.stats
    if model:
        raise ValueError(f"--model is for tcl and mlp; {kind} learns online")
    if kind in ("xgb", "random"):
        inner = (ms.cost_model.XGBModel(num_tuning_cores=threads) if kind == "xgb"
                 else ms.cost_model.RandomModel(seed=seed))
        cm = CountedCostModel(inner)
        return cm, cm.stats
    raise ValueError(f"unknown cost model {kind!r}; one of {', '.join(COST_MODELS)}")
