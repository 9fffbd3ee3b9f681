"""TCL's KB inside MetaSchedule's search: a `PyCostModel` over the torch-free serving path.

    cm = TCLCostModel("models:/tcl-kb-amd-zen4-avx512@production")   # or a .onnx file
    ms.tune_tasks(..., cost_model=cm)

`predict` encodes each candidate's trace as the project's featurizer (tcl.features.Featurizer, at
the model's max_len) encodes the steps `tcl ingest` makes of its database line
(tcl.tuner.traces.CandidateFeatures: in one pass of TCL's trace library where built) and scores
them with tcl.serving's Predictor, `CHUNK` candidates at a time (the features of a chunk stay in
cache, and their buffer is reused). The KB ranks (LambdaRank scores of
any sign); MetaSchedule wants a non-negative "normalised throughput" (it clamps negatives to 0
and samples parents in proportion to the score), and compares scores of different calls in one
heap, so each score goes through one fixed increasing map, the logistic function.

A schedule the search carries unchanged into its next generation is the same trace object: its
score is kept by the object (held, so its address cannot be reused) and not computed again.
Counters (`stats`): predict calls, candidates scored, of them served from that cache, and
seconds spent in predict, split into trace -> steps, steps -> features and scoring (with the
trace library, trace -> features is one pass, counted as `features_seconds`).

With `fine_tune`, `update` fine-tunes the KB's torch net on the run's measurements so far
(tcl.tuner.fine_tune; torch is imported then, never otherwise), serves the re-exported ONNX
model and forgets the cached scores. With `explore` (tcl.tuner.explore), `update` tells it each
measured batch, and `predict` ranks a share of a task's candidates at random while the task's
best latency has stopped falling. With `online` (tcl.tuner.online), MetaSchedule's XGBoost learns
the run's measurements beside the KB and, once trained, takes its share of each chunk's ranking
(the cached scores are forgotten after each batch then, as XGBoost has moved).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.cost_model import PyCostModel

from tcl.features import Featurizer
from tcl.records import FAILED_LATENCY
from tcl.serving import Predictor, load_predictor
from tcl.tuner.explore import Exploration
from tcl.tuner.online import OnlineModel
from tcl.tuner.traces import CandidateFeatures

CACHE_LIMIT = 50_000  # traces whose scores are kept (a generation is 512; the search runs 5 a round)
CHUNK = 512  # candidates featurized and scored together (a generation; its features ~8 MB)


@dataclass
class PredictStats:
    """What the cost model did inside one tuning run."""

    predict_calls: int = 0
    candidates_scored: int = 0
    cached: int = 0                 # of candidates_scored, answered from the per-trace cache
    predict_seconds: float = 0.0    # wall time inside predict
    steps_seconds: float = 0.0      # trace -> steps
    features_seconds: float = 0.0   # steps -> (x, mask)
    score_seconds: float = 0.0      # onnxruntime (with --online-weight, XGBoost's share too: online_score_seconds)
    measured: int = 0               # candidates whose measurements update() was handed
    path: str = ""                  # trace -> features: "library" (one pass), "steps" or "python"
    updates: int = 0                # fine-tuning updates (the model swapped)
    update_seconds: float = 0.0     # in them: features, training, export, new session
    fine_tune: list = field(default_factory=list)  # per update: measured, loss before/after, seconds
    explore: list = field(default_factory=list)    # per measured batch: best, stalled batches, share at random
    online_train_seconds: float = 0.0  # XGBoost beside the KB (--online-weight): in update, training
    online_score_seconds: float = 0.0  # in predict (of predict_seconds): its features, prediction, blend
    online_blended: int = 0         # candidates it helped rank (after its warm-up)

    def as_dict(self) -> dict:
        out = asdict(self)
        out["candidates_per_s"] = self.candidates_scored / self.predict_seconds if self.predict_seconds else None
        return out


def positive_scores(raw: np.ndarray) -> np.ndarray:
    """The logistic map of KB scores (float64, in (0, 1), order kept up to |s| ~ 36); a
    non-finite score (an empty program) becomes 0, the least MetaSchedule accepts."""
    raw = np.asarray(raw, np.float64)
    out = np.zeros(len(raw), np.float64)
    ok = np.isfinite(raw)
    out[ok] = 1.0 / (1.0 + np.exp(-raw[ok]))
    return out


@derived_object
class TCLCostModel(PyCostModel):
    """A registered KB (or an .onnx file) as a MetaSchedule cost model.

    `model`: a ``models:/`` URI, an ``.onnx`` file, or a loaded Predictor; with `fine_tune`, a
    ``models:/`` URI or a checkpoint (file or training directory). `family`: refuse a model of
    another hardware family. `fine_tune`: learn from this run's measurements in `update`
    (settings: `fine_tune_params`, over params.yaml ``tune.fine_tune``). `way`: how traces become
    features (tcl.tuner.traces.CandidateFeatures: "library", "steps" or "python"). `explore`:
    settings of tcl.tuner.explore (`explore_params()`'s), its draws seeded by `seed`; None or a
    share_max of 0: off. `online`: settings of tcl.tuner.online (`online_params()`'s); None or a
    weight of 0: off.
    """

    def __init__(self, model, family: str | None = None, threads: int = 2, fine_tune: bool = False,
                 fine_tune_params: dict | None = None, way: str = "library", explore: dict | None = None,
                 seed: int = 0, online: dict | None = None):
        super().__init__()
        self.threads = threads
        self.stats = PredictStats()
        self.fine_tuner = None
        self.explore = Exploration(explore, seed) if explore and float(explore["share_max"]) > 0 else None
        if self.explore is not None:
            self.stats.explore = self.explore.history
        self.online = OnlineModel(online, threads) if online and float(online["weight"]) > 0 else None
        if fine_tune:
            from tcl.tuner.fine_tune import CheckpointNeeded, KBFineTuner

            if isinstance(model, Predictor):
                raise CheckpointNeeded("fine-tuning needs the KB's torch checkpoint, not a loaded Predictor")
            if family is None:
                raise ValueError("fine-tuning needs the hardware family (the ONNX export carries it)")
            self.fine_tuner = KBFineTuner.from_source(model, family, fine_tune_params)
            self.stats.fine_tune = self.fine_tuner.history
            if not str(model).startswith("models:/"):  # a checkpoint: served as exported now
                model = Predictor(self.fine_tuner.export(), source=str(model), threads=threads)
        self.predictor: Predictor = (model if isinstance(model, Predictor)
                                     else load_predictor(model, expected_family=family, threads=threads))
        self.featurizer = Featurizer(self.predictor.max_len)
        # the featurizer must be the one the KB was trained with (version, shape, vocabulary)
        self.predictor.check_features(self.featurizer.meta, family=self.predictor.family)
        self.features = CandidateFeatures(self.featurizer, way)
        self._scores: dict[tuple[int, int], float] = {}
        self._held: list = []  # the traces whose addresses key self._scores

    def load(self, path: str) -> None:
        raise NotImplementedError("TCLCostModel loads its KB from the registry or an .onnx file "
                                  "when constructed")

    def save(self, path: str) -> None:
        raise NotImplementedError("TCLCostModel has no state of its own to save: the KB is in the "
                                  "registry")

    def update(self, context, candidates, results) -> None:
        self.stats.measured += len(candidates)
        if not candidates:
            return
        if self.online is not None:
            self.online.observe(context, candidates, results)
            self.stats.online_train_seconds = self.online.train_seconds
            if self.online.ready:  # XGBoost retrained: the blended scores kept are its old ones
                self._scores.clear()
                self._held.clear()
        if self.fine_tuner is None and self.explore is None:
            return
        latency = np.array([_mean_latency(r) for r in results], np.float64)
        task = _task_key(context)
        if self.explore is not None:
            self.explore.observe(task, latency)
        if self.fine_tuner is None:
            return
        start = time.perf_counter()
        x, mask = self.features(candidates)
        self.fine_tuner.add(task, x, mask, latency)
        onnx_bytes = self.fine_tuner.update()
        if onnx_bytes is not None:
            old = self.predictor
            self.predictor = Predictor(onnx_bytes, source=f"{old.source} (fine-tuned)",
                                       registry_info=old.registry_info, threads=self.threads)
            old.close()
            self._scores.clear()  # scored by the previous model
            self._held.clear()
            self.stats.updates += 1
        self.stats.update_seconds += time.perf_counter() - start

    def predict(self, context, candidates) -> np.ndarray:
        start = time.perf_counter()
        n = len(candidates)
        out = np.empty(n, np.float64)
        traces = [c.sch.trace for c in candidates]
        keys = [(t.__chandle__(), len(t.insts)) for t in traces]
        todo = [i for i, k in enumerate(keys) if k not in self._scores]
        for i, k in enumerate(keys):
            if k in self._scores:
                out[i] = self._scores[k]
        if len(self._scores) + len(todo) > CACHE_LIMIT:
            self._scores.clear()
            self._held.clear()
        st = self.stats
        task = _task_key(context) if self.explore is not None else None
        for a in range(0, len(todo), CHUNK):
            rows = todo[a:a + CHUNK]
            t0 = time.perf_counter()
            chunk = [candidates[i] for i in rows]
            x, mask = self.features(chunk)
            t1 = time.perf_counter()
            scores = positive_scores(self.predictor.predict(x, mask))
            if self.online is not None:
                scores = self.online.apply(context, chunk, scores)
            if task is not None:
                scores = self.explore.apply(task, scores)
            t2 = time.perf_counter()
            out[rows] = scores
            for i, s in zip(rows, scores):
                self._scores[keys[i]] = float(s)
                self._held.append(traces[i])
            st.path = self.features.path
            if st.path == "library":
                st.features_seconds += t1 - t0
            else:
                st.steps_seconds += self.features.steps_seconds
                st.features_seconds += t1 - t0 - self.features.steps_seconds
            st.score_seconds += t2 - t1
        st.predict_calls += 1
        st.candidates_scored += n
        st.cached += n - len(todo)
        st.predict_seconds += time.perf_counter() - start
        if self.online is not None:
            st.online_score_seconds, st.online_blended = self.online.score_seconds, self.online.blended
        return out


def _task_key(context) -> str:
    """The task a MetaSchedule context tunes: its name, else its module's handle."""
    return str(context.task_name) if context.task_name else str(context.mod.__chandle__())


def _mean_latency(result) -> float:
    """A RunnerResult's mean latency in seconds; inf for a failed build or run."""
    if result.error_msg is not None or not result.run_secs:
        return float("inf")
    secs = [float(s) for s in result.run_secs]
    return sum(secs) / len(secs) if max(secs) < FAILED_LATENCY else float("inf")
