"""The current model's view of a pool (embedding, clusters, uncertainty, predictions) and its
retraining between rounds: what every model-using strategy reads.

Uncertainty has up to three sources, each rank-normalised over the programs asked about and
averaged:

* MC dropout: the spread (sd) of ``mc_samples`` scores of the current model with its dropout on
  (``CostModel.predict(..., dropout=True)``). With ``mc_dropout`` > 0 a *given* model (``--model``,
  e.g. the family's KB, and its fine-tuned copies) trained without dropout -- the KB presets have
  dropout 0 -- runs its dropout layers at that rate for these samples, so the KB's uncertainty
  serves from the first round as the issue designs it (params.yaml keeps 0: measured below the
  KB's embedding alone, docs/sampling.md). A cold run's fresh models keep their own dropout (none
  for the presets): the committee serves them from the second round, and cold subsets are chosen
  the same whatever the setting. Skipped when no dropout is active (two probe passes agree) and
  none is switched on.
* Ensemble disagreement: given several models (``tcl sample --model A --model B ...``, e.g. KBs
  of the family trained with different seeds), the sd over them of each program's within-task
  rank of their scores (ranks: members trained apart need not share a scale). Serves from the
  first round; each member is fine-tuned between rounds like a single given model.
* Committee disagreement: the sd over ``committee`` ridge regressors, each fitted on a bootstrap
  resample of the revealed programs (their embedding -> y normalised within each task over the
  revealed programs). Needs labels, so it serves from the second round on.

With none (a cold first round, or one dropout-free model before any label) there is no
uncertainty and RDU chooses by representativeness and diversity alone.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field

import numpy as np

from tcl.sampling import space
from tcl.sampling.space import rank01

DEFAULTS = {
    "pool_ratio": 0.5,        # the representativeness pass keeps this share of the unchosen programs
    "stratify": "task",       # task: the budget is spread over the tasks first (in proportion to
                              # their programs), then over the clusters inside each; none: clusters only
    # uncertainty first: on x86-sse-t1 (docs/sampling.md) 0.5/0.5/2 with pool 0.5 beat 1/1/1 with pool 0.3
    "weights": {"representativeness": 0.5, "diversity": 0.5, "uncertainty": 2.0},
    "max_clusters": 256,      # K-Means clusters per round: min(round budget, this)
    "embed_dims": 32,         # principal components kept of the (standardised) embedding
    "fit_rows": 20000,        # programs that fit the projection and the K-Means centres
    "duplicate_radius": 0.05,  # closer than this share of its cluster's median radius to a chosen
                               # program: a near-duplicate, chosen only when nothing else is left
    "mc_samples": 8,          # MC-dropout score samples per program
    "mc_dropout": 0.0,        # dropout rate of the MC samples of a given model trained without dropout
                              # (its Dropout layers at p 0 run at this rate while sampling); 0: none
    "committee": 5,           # bootstrap ridge members
    "committee_min": 8,       # revealed programs needed before the committee votes
    "balto_factor": 4,        # BALTO: candidates (most uncertain) per program to choose
    "balto_bias": 1.0,        # BALTO: weight of the predicted throughput in its clustering
    # the model retrained between rounds: a given model is fine-tuned; without one a fresh model
    # of `kind` is trained on the revealed programs (`none`: keep the cold embedding, committee only)
    "retrain": {"kind": "mamba", "preset": None, "train": {"epochs": 10, "batch_size": 64, "lr": 0.002,
                                                           "patience": 100, "threads": 1}},
}

# weights `sample.weights` may add (absent: 0): performance favours the programs the current
# model predicts fastest in their task (RDU only; not in the paper; docs/sampling.md measures it)
OPTIONAL_WEIGHTS = ("performance",)


@dataclass
class SampleSettings:
    """The `sample:` section of params.yaml (defaults: DEFAULTS), plus the `models:`/`train:`
    sections a retrained model is built and trained with."""

    pool_ratio: float = DEFAULTS["pool_ratio"]
    stratify: str = DEFAULTS["stratify"]
    weights: dict = field(default_factory=lambda: dict(DEFAULTS["weights"]))
    max_clusters: int = DEFAULTS["max_clusters"]
    embed_dims: int = DEFAULTS["embed_dims"]
    fit_rows: int = DEFAULTS["fit_rows"]
    duplicate_radius: float = DEFAULTS["duplicate_radius"]
    mc_samples: int = DEFAULTS["mc_samples"]
    mc_dropout: float = DEFAULTS["mc_dropout"]
    committee: int = DEFAULTS["committee"]
    committee_min: int = DEFAULTS["committee_min"]
    balto_factor: float = DEFAULTS["balto_factor"]
    balto_bias: float = DEFAULTS["balto_bias"]
    retrain: dict = field(default_factory=lambda: {**DEFAULTS["retrain"], "train": dict(DEFAULTS["retrain"]["train"])})
    models: dict = field(default_factory=dict)   # params.yaml models: (configs of retrained kinds)
    train: dict = field(default_factory=dict)    # params.yaml train:

    @classmethod
    def from_params(cls, params: dict | None) -> "SampleSettings":
        """Settings from a params dict (``tcl.config.load_params``); unknown keys raise."""
        params = params or {}
        section = dict(params.get("sample") or {})
        # the run's own choices, read by callers (ratios: the main job's sample stages, dvc.yaml)
        for key in ("strategy", "ratio", "ratios", "rounds", "seed"):
            section.pop(key, None)
        unknown = set(section) - set(DEFAULTS)
        if unknown:
            raise ValueError(f"unknown sample: keys {sorted(unknown)} (known: {sorted(DEFAULTS)})")
        weights = {**DEFAULTS["weights"], **(section.pop("weights", None) or {})}
        if not set(DEFAULTS["weights"]) <= set(weights) <= set(DEFAULTS["weights"]) | set(OPTIONAL_WEIGHTS):
            raise ValueError(f"sample.weights: keys must be {sorted(DEFAULTS['weights'])} and optionally "
                             f"{sorted(OPTIONAL_WEIGHTS)}, got {sorted(weights)}")
        retrain = {**DEFAULTS["retrain"], **(section.pop("retrain", None) or {})}
        retrain["train"] = {**DEFAULTS["retrain"]["train"], **(retrain.get("train") or {})}
        settings = cls(**section, weights={k: float(v) for k, v in weights.items()}, retrain=retrain,
                       models=dict(params.get("models") or {}), train=dict(params.get("train") or {}))
        if settings.stratify not in ("task", "none"):
            raise ValueError(f"sample.stratify must be task or none, got {settings.stratify!r}")
        if not 0 < settings.pool_ratio <= 1:
            raise ValueError(f"sample.pool_ratio must be in (0, 1], got {settings.pool_ratio}")
        if not 0 <= settings.mc_dropout < 1:
            raise ValueError(f"sample.mc_dropout must be in [0, 1), got {settings.mc_dropout}")
        return settings

    def as_dict(self) -> dict:
        return {k: getattr(self, k) for k in DEFAULTS}


class Learner:
    """Holds what the rounds learn: builds each round's PoolView and retrains between rounds."""

    def __init__(self, settings: SampleSettings, seed: int = 0):
        self.settings = settings
        self.seed = int(seed)
        self._embedding: tuple | None = None  # (model identity, projected embedding), reused while unchanged
        self.retrained = 0

    def view(self, pool, members: list, chosen: np.ndarray, latency: np.ndarray, rng: np.random.Generator,
             given: bool = False) -> "PoolView":
        """`members`: the current model(s), [] for none; the first serves the embedding. `given`:
        they are the caller's (or fine-tuned copies of them), not a fresh retrained one."""
        return PoolView(self, pool, members, chosen, latency, rng, given)

    def embedding(self, pool, model) -> np.ndarray:
        key = (id(model), self.retrained)
        if self._embedding is None or self._embedding[0] != key:
            raw = (space.model_embedding(model, pool.x, pool.mask) if model is not None
                   else space.cold_embedding(pool.x, pool.mask))
            bad = ~np.isfinite(raw).all(axis=1)
            if bad.any():
                raise ValueError(f"{int(bad.sum())} of {len(raw)} programs have a non-finite "
                                 f"{'model ' if model is not None else ''}embedding (first: row "
                                 f"{int(np.flatnonzero(bad)[0])}); fix the features (tcl featurize) first")
            emb = space.project(raw, self.settings.embed_dims, np.random.default_rng([self.seed, 7]),
                                self.settings.fit_rows)
            self._embedding = (key, emb)
        return self._embedding[1]

    def retrain(self, pool, members: list, chosen: np.ndarray, latency: np.ndarray, round_index: int) -> list:
        """The model(s) after training on every revealed program: a copy of each given model
        continues from its weights (the caller's models, e.g. a family's KB, are never changed);
        without any, one fresh model of ``retrain.kind`` ([] when that is ``none``)."""
        import copy

        from tcl.models import model_config, new_model
        from tcl.training import seed_everything, train_model

        kind = str(self.settings.retrain.get("kind") or "none")
        if not members and kind == "none":
            return []
        train_params = {**self.settings.train, **self.settings.retrain["train"],
                        "seed": self.seed * 1000 + round_index}
        seed_everything(int(train_params["seed"]))
        labelled = pool.labelled_set(chosen, latency)
        if not members:
            config = model_config(kind, {"models": self.settings.models}, self.settings.retrain.get("preset"))
            members = [new_model(kind, labelled.x.shape[2], config, labelled.meta)]
        else:
            members = [copy.deepcopy(m) for m in members]
        trained = []
        for i, model in enumerate(members):
            if i:  # each member's training from the same seed, the first's as it always was
                seed_everything(int(train_params["seed"]))
            with tempfile.TemporaryDirectory(prefix="tcl-sample-") as tmp:
                trained.append(train_model(model, labelled, [], train_params, tmp, progress=False, resume=False)[0])
        self.retrained += 1
        return trained


class PoolView:
    """One round's view of the pool through the current model; everything is computed on first use."""

    def __init__(self, learner: Learner, pool, members: list, chosen, latency, rng, given: bool = False):
        self.learner, self.pool = learner, pool
        self.members = list(members)
        self.model = self.members[0] if self.members else None   # serves the embedding and predictions
        self.chosen, self.latency, self.rng = chosen, latency, rng
        self.settings = learner.settings
        self.given = bool(given)
        self.uncertainty_source = "none"
        self._committee = None

    @property
    def embedding(self) -> np.ndarray:
        """(N, d) float32: the projected embedding of every program."""
        return self.learner.embedding(self.pool, self.model)

    def clusters(self, k: int, rows: np.ndarray | None = None, weight: np.ndarray | None = None) -> space.Clusters:
        seed = int(self.rng.integers(2**31 - 1))
        return space.kmeans(self.embedding, k, seed, self.settings.fit_rows, weight=weight, rows=rows)

    # -- uncertainty and predictions --------------------------------------------------------
    def uncertainty(self, index: np.ndarray) -> np.ndarray | None:
        """(len(index),) in [0, 1], higher = less certain; None when no source serves yet."""
        parts, names = [], []
        mc, mc_name = self._mc_dropout(index)
        if mc is not None:
            parts.append(rank01(mc))
            names.append(mc_name)
        ensemble = self._ensemble_spread(index)
        if ensemble is not None:
            parts.append(rank01(ensemble))
            names.append(f"ensemble-{len(self.members)}")
        committee = self._committee_predictions(index)
        if committee is not None:
            parts.append(rank01(committee.std(axis=0)))
            names.append("committee")
        self.uncertainty_source = "+".join(names) or "none"
        return np.mean(parts, axis=0) if parts else None

    def predicted(self, index: np.ndarray) -> np.ndarray | None:
        """Predicted throughput score of programs `index` (higher = faster): the model's, else the
        committee's mean; None when neither exists."""
        if self.model is not None:
            return self._predict(index, dropout=False)
        committee = self._committee_predictions(index)
        return committee.mean(axis=0) if committee is not None else None

    def _predict(self, index: np.ndarray, dropout: bool | float, batch: int = 4096, model=None) -> np.ndarray:
        """Scores of programs `index` by `model` (default: the current model)."""
        model = self.model if model is None else model
        index = np.asarray(index, np.int64)
        out = [model.predict(np.asarray(self.pool.x[index[a:a + batch]]), self.pool.mask[index[a:a + batch]],
                             dropout=dropout) for a in range(0, len(index), batch)]
        return np.concatenate(out) if out else np.zeros(0)

    def _ensemble_spread(self, index: np.ndarray) -> np.ndarray | None:
        """The sd over the ensemble's members of each program's within-task score rank, or None
        (fewer than two members)."""
        if len(self.members) < 2 or len(index) == 0:
            return None
        task = self.pool.task[np.asarray(index, np.int64)]
        ranks = np.stack([space.task_rank01(self._predict(index, False, model=m), task) for m in self.members])
        return ranks.std(axis=0)

    def _mc_dropout(self, index: np.ndarray) -> tuple[np.ndarray | None, str]:
        """(the sd of the MC-dropout scores of programs `index` or None, the source's name)."""
        if self.model is None or self.settings.mc_samples < 2 or len(index) == 0:
            return None, ""
        from tcl.training import seed_everything

        seed_everything(int(self.rng.integers(2**31 - 1)))
        probe = np.asarray(index[:64])
        if not np.array_equal(self._predict(probe, True), self._predict(probe, True)):
            return self._mc_samples(index).std(axis=0), "mc-dropout"
        rate = self.settings.mc_dropout if self.given else 0.0
        if rate <= 0:
            return None, ""  # no active dropout: every sample is the same score
        spread = self._mc_samples(index, rate).std(axis=0)   # dropout layers trained at 0 run at `rate`
        if not spread.any():
            return None, ""  # a kind without dropout layers (xgb, ...)
        return spread, f"mc-dropout@{rate:g}"

    def _mc_samples(self, index: np.ndarray, dropout: bool | float = True) -> np.ndarray:
        return np.stack([self._predict(index, dropout) for _ in range(int(self.settings.mc_samples))])

    def _committee_predictions(self, index: np.ndarray) -> np.ndarray | None:
        """(members, len(index)) predictions of the bootstrap ridge committee, or None."""
        s = self.settings
        if len(self.chosen) < max(2, s.committee_min) or s.committee < 2:
            return None
        if self._committee is None:
            from tcl.features import task_labels

            emb = self.embedding
            task = self.pool.task[self.chosen]
            y = task_labels(task, self.latency).astype(np.float64)   # within-task, over the revealed only
            z = np.hstack([emb[self.chosen].astype(np.float64), np.ones((len(self.chosen), 1))])
            rng = np.random.default_rng([int(self.rng.integers(2**31 - 1)), 3])
            coefs = []
            for _ in range(int(s.committee)):
                rows = rng.integers(0, len(z), size=len(z))
                a = z[rows]
                coefs.append(np.linalg.solve(a.T @ a + np.eye(a.shape[1]), a.T @ y[rows]))  # ridge, alpha 1
            self._committee = np.stack(coefs, axis=1)  # (d + 1, members)
        emb = self.embedding[np.asarray(index, np.int64)]
        return (emb @ self._committee[:-1] + self._committee[-1]).T.astype(np.float64)

