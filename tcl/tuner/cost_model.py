"""TCL's KB inside MetaSchedule's search: a `PyCostModel` over the torch-free serving path.

    cm = TCLCostModel("models:/tcl-kb-amd-zen4-avx512@production")   # or a .onnx file
    ms.tune_tasks(..., cost_model=cm)

`predict` turns each candidate's trace into the steps `tcl ingest` makes of its database line
(tcl.tuner.traces), encodes them with the project's featurizer (tcl.features.Featurizer, at the
model's max_len) and scores them with tcl.serving's Predictor. The KB ranks (LambdaRank scores of
any sign); MetaSchedule wants a non-negative "normalised throughput" (it clamps negatives to 0
and samples parents in proportion to the score), and compares scores of different calls in one
heap, so each score goes through one fixed increasing map, the logistic function.

A schedule the search carries unchanged into its next generation is the same trace object: its
score is kept by the object (held, so its address cannot be reused) and not computed again.
Counters (`stats`): predict calls, candidates scored, of them served from that cache, and
seconds spent in predict, split into trace -> steps, steps -> features and scoring.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
from tvm.ir.utils import derived_object
from tvm.s_tir.meta_schedule.cost_model import PyCostModel

from tcl.features import Featurizer
from tcl.serving import Predictor, load_predictor
from tcl.tuner.traces import candidate_steps

CACHE_LIMIT = 50_000  # traces whose scores are kept (a generation is 512; the search runs 5 a round)


@dataclass
class PredictStats:
    """What the cost model did inside one tuning run."""

    predict_calls: int = 0
    candidates_scored: int = 0
    cached: int = 0                 # of candidates_scored, answered from the per-trace cache
    predict_seconds: float = 0.0    # wall time inside predict
    steps_seconds: float = 0.0      # trace -> steps
    features_seconds: float = 0.0   # steps -> (x, mask)
    score_seconds: float = 0.0      # onnxruntime
    measured: int = 0               # candidates whose measurements update() was handed

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

    `model`: a ``models:/`` URI, an ``.onnx`` file, or a loaded Predictor. `family`: refuse a
    model of another hardware family. `fine_tune`: learn from this run's measurements, not
    implemented: the KB is exported to ONNX, and fine-tuning needs its checkpoint and torch.
    """

    def __init__(self, model, family: str | None = None, threads: int = 2, fine_tune: bool = False):
        super().__init__()
        if fine_tune:
            raise NotImplementedError("fine-tuning the KB on a tuning run's measurements is not "
                                      "implemented; tune with the KB as registered")
        self.predictor: Predictor = (model if isinstance(model, Predictor)
                                     else load_predictor(model, expected_family=family, threads=threads))
        self.featurizer = Featurizer(self.predictor.max_len)
        # the featurizer must be the one the KB was trained with (version, shape, vocabulary)
        self.predictor.check_features(self.featurizer.meta, family=self.predictor.family)
        self.stats = PredictStats()
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
        if todo:
            t0 = time.perf_counter()
            steps = candidate_steps(candidates[i] for i in todo)
            t1 = time.perf_counter()
            x, mask = self.featurizer(steps)
            t2 = time.perf_counter()
            scores = positive_scores(self.predictor.predict(x, mask))
            t3 = time.perf_counter()
            out[todo] = scores
            if len(self._scores) + len(todo) > CACHE_LIMIT:
                self._scores.clear()
                self._held.clear()
            for i, s in zip(todo, scores):
                self._scores[keys[i]] = float(s)
                self._held.append(traces[i])
            st = self.stats
            st.steps_seconds += t1 - t0
            st.features_seconds += t2 - t1
            st.score_seconds += t3 - t2
        self.stats.predict_calls += 1
        self.stats.candidates_scored += n
        self.stats.cached += n - len(todo)
        self.stats.predict_seconds += time.perf_counter() - start
        return out
