"""The baselines RDU is compared with, behind the same interface and rounds (tcl.sampling.base).

* ``random``: uniform over the unchosen programs; never looks at a model.
* ``kmeans``: representativeness alone: K-Means (k = min(round budget, ``max_clusters``)) over
  the unchosen programs, the budget spread over the clusters in proportion to their size, each
  cluster's share taken nearest its centre.
* ``uncertainty``: the most uncertain unchosen programs (tcl.sampling.learner); uniform in a
  round where no uncertainty serves yet (a cold first round).
* ``balto``: a BALTO-style batch active learner (Bi et al., ICLR 2023: biased-diversity-based
  active learning): the ``balto_factor`` × budget most uncertain programs, clustered with K-Means
  weighted towards programs predicted fast (``1 + balto_bias · rank of the predicted score``: the
  bias against measuring many slow programs), each cluster's share taken by uncertainty plus that
  bias. Without uncertainty or predictions (cold) it reduces to K-Means over a random pool.
"""

from __future__ import annotations

import math

import numpy as np

from tcl.sampling import space
from tcl.sampling.base import RoundState, Sampler


class RandomSampler(Sampler):
    name = "random"
    uses_model = False

    def choose(self, state: RoundState, budget: int) -> np.ndarray:
        return state.rng.choice(state.unchosen, size=budget, replace=False)


class KMeansSampler(Sampler):
    name = "kmeans"

    def choose(self, state: RoundState, budget: int) -> np.ndarray:
        unchosen = state.unchosen
        clusters = state.view.clusters(min(budget, self.settings.max_clusters), rows=unchosen)
        label = clusters.label[unchosen]
        sizes = np.bincount(label, minlength=clusters.k)
        quota = space.allocate(budget, sizes, sizes)
        picked = []
        for c, m in enumerate(space.group_by(label, clusters.k)):
            if quota[c]:
                near = m[np.argsort(clusters.dist[unchosen[m]], kind="stable")[:quota[c]]]
                picked.append(unchosen[near])
        state.record.update({"pool": int(len(unchosen)), "clusters": int(clusters.k)})
        return np.concatenate(picked)


class UncertaintySampler(Sampler):
    name = "uncertainty"

    def choose(self, state: RoundState, budget: int) -> np.ndarray:
        unchosen = state.unchosen
        unc = state.view.uncertainty(unchosen)
        if unc is None:
            return state.rng.choice(unchosen, size=budget, replace=False)
        order = np.lexsort((state.rng.random(len(unchosen)), -unc))  # most uncertain first, ties at random
        state.record["scores"] = {"uncertainty": float(unc[order[:budget]].mean())}
        return unchosen[order[:budget]]


class BaltoSampler(Sampler):
    name = "balto"

    def choose(self, state: RoundState, budget: int) -> np.ndarray:
        s, view = self.settings, state.view
        unchosen = state.unchosen
        n_pool = min(len(unchosen), max(budget, math.ceil(s.balto_factor * budget)))
        unc_all = view.uncertainty(unchosen)
        if unc_all is None:
            pool = np.sort(state.rng.choice(unchosen, size=n_pool, replace=False))
            unc = np.zeros(n_pool)
        else:
            top = np.lexsort((state.rng.random(len(unchosen)), -unc_all))[:n_pool]
            pool, unc = unchosen[top], unc_all[top]
            order = np.argsort(pool)
            pool, unc = pool[order], unc[order]
        predicted = view.predicted(pool)
        fast = space.rank01(predicted) if predicted is not None else np.zeros(n_pool)
        weight = 1.0 + s.balto_bias * fast
        clusters = view.clusters(min(budget, s.max_clusters), rows=pool, weight=weight)
        label = clusters.label[pool]
        members = space.group_by(label, clusters.k)
        mass = np.bincount(label, weights=weight, minlength=clusters.k)
        quota = space.allocate(budget, mass, np.bincount(label, minlength=clusters.k))
        score = unc + s.balto_bias * fast
        picked = []
        for c in np.flatnonzero(quota):
            m = members[c]
            picked.append(pool[m[np.argsort(-score[m], kind="stable")[:quota[c]]]])
        state.record.update({"pool": int(len(unchosen)), "candidates": int(n_pool), "clusters": int(clusters.k)})
        return np.concatenate(picked)
