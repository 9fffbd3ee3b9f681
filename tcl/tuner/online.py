"""MetaSchedule's XGBoost learning the run beside the KB (`tcl tune --online-weight W`, off by
default).

    online = OnlineModel(online_params({"weight": 0.5}), threads=2)
    online.observe(context, candidates, results)          # each measured batch
    scores = online.apply(context, candidates, scores)    # each predict chunk (the KB's positive scores)

The KB knows the platform before the run starts and XGBoost knows nothing: the KB leads early in
every tuning study (docs/tuning.md). XGBoost, learning from the run's own measurements, keeps
finding faster schedules on the tasks where the KB's ranking of the fast schedules is wrong (the
larger dense tasks on the Intel platform, docs/new-platform.md) and ends below it there. Both
can serve one search: once XGBoost has `warmup` measurements (its own default before it trains,
100), each chunk of candidates the KB scored is ranked by ``(1 - weight) * KB rank + weight *
XGBoost rank`` (ranks within the chunk, ties to the KB), and the chunk's own KB scores are handed
out in that order: the scores' distribution is the KB's (MetaSchedule compares scores across
calls and samples parents in proportion to them), their order is the blend. Before the warm-up,
and at weight 0, the scores are the KB's unchanged.

XGBoost here is MetaSchedule's `XGBModel` as `--cost-model xgb` runs it (per-store features,
adaptive retraining), fed the same measurements the KB fine-tunes on.
"""

from __future__ import annotations

import time

import numpy as np

DEFAULT_ONLINE = {
    "weight": 0.0,   # XGBoost's share of each chunk's ranking once it has trained (0: off)
    "warmup": 100,   # measurements of the run before XGBoost trains and is blended in
}


def online_params(overrides: dict | None = None) -> dict:
    """`DEFAULT_ONLINE`, then params.yaml ``tune.online``, then `overrides`; unknown keys and
    values out of range raise."""
    from tcl.config import tune_settings

    p = tune_settings("online", DEFAULT_ONLINE, overrides)
    if not 0.0 <= float(p["weight"]) <= 1.0:
        raise ValueError(f"tune.online weight must be in [0, 1], not {p['weight']!r}")
    if int(p["warmup"]) < 1:
        raise ValueError(f"tune.online warmup must be at least 1, not {p['warmup']!r}")
    return p


def online_for(cost_model: str, overrides: dict | None = None) -> dict | None:
    """The online blend a run of `cost_model` uses: tcl's settings (`online_params`); None for a
    peer (a weight above 0 asked of one raises)."""
    if cost_model == "tcl":
        return online_params(overrides)
    if overrides and float(overrides.get("weight", 0)) > 0:
        raise ValueError(f"--online-weight is for --cost-model tcl ({cost_model} is scored as it ships)")
    return None


def blend_ranks(scores: np.ndarray, online: np.ndarray, weight: float) -> np.ndarray:
    """`scores` reordered: the candidate with the k-th lowest blended rank gets the k-th lowest of
    `scores` (ranks in [0, 1] within the chunk, ties broken by the KB's rank)."""
    n = len(scores)
    rank_kb = np.argsort(np.argsort(scores, kind="stable"), kind="stable") / (n - 1)
    rank_online = np.argsort(np.argsort(online, kind="stable"), kind="stable") / (n - 1)
    blended = (1.0 - weight) * rank_kb + weight * rank_online
    out = np.empty(n, np.float64)
    out[np.lexsort((rank_kb, blended))] = np.sort(np.asarray(scores, np.float64))
    return out


class OnlineModel:
    """MetaSchedule's XGBoost fed the run's measurements, blended into the KB's chunk scores once
    it has trained."""

    def __init__(self, params: dict, threads: int):
        from tvm.s_tir import meta_schedule as ms

        self.weight = float(params["weight"])
        self.warmup = int(params["warmup"])
        self.model = ms.cost_model.XGBModel(num_tuning_cores=threads, num_warmup_samples=self.warmup)
        self.blended = 0          # candidates whose score took XGBoost's rank into account
        self.train_seconds = 0.0  # in observe: XGBoost's features of the batch and its training
        self.score_seconds = 0.0  # in apply: per-store features of the chunk, prediction, blend

    @property
    def ready(self) -> bool:
        # XGBModel's own test: before it, its predict is uniform noise (a candidate whose
        # per-store features are empty never enters data_size, so a count of the candidates
        # handed to it could run ahead)
        return self.model.data_size >= self.warmup and self.model.booster is not None

    def observe(self, context, candidates, results) -> None:
        start = time.perf_counter()
        self.model.update(context, candidates, results)
        self.train_seconds += time.perf_counter() - start

    def apply(self, context, candidates, scores: np.ndarray) -> np.ndarray:
        """`scores` (one chunk, the KB's) blended with XGBoost's ranking; unchanged (the same
        array) before the warm-up, at weight 0, or for a chunk of one."""
        if not self.ready or self.weight <= 0.0 or len(scores) < 2:
            return scores
        start = time.perf_counter()
        online = np.asarray(self.model.predict(context, candidates), np.float64)
        out = blend_ranks(scores, online, self.weight)
        self.blended += len(scores)
        self.score_seconds += time.perf_counter() - start
        return out
