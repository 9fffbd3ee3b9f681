"""RDU: Representativeness, Diversity, Uncertainty (the paper's active sampler), one round at a time.

Each round, in the current embedding (``tcl.sampling.learner``; the cold embedding before any
model exists):

1. **Representativeness pass** (cheap): K-Means over the unchosen programs with
   k = min(round budget, ``max_clusters``) clusters. The cells are the clusters, split by task
   when ``stratify: task`` (tasks are known before measuring; each task's ranking is learnt from
   its own programs). Each cell keeps the ``pool_ratio`` share of its programs nearest their
   centre (shares over the tasks in proportion to their programs, then over each task's cells in
   proportion to theirs, so every cell is in the pool). R = 1 - a program's rank of distance to
   its centre within its cell / the cell's size.
2. **Diversity + uncertainty** choose the round's budget from that pool: the budget is spread
   over the cells in the same proportions; inside a cell programs are taken greedily by
   ``w_r·R + w_u·U + w_d·D``, where U is the uncertainty (rank in [0, 1]; 0 when none serves)
   and D = min(1, distance to the nearest program already chosen in the cell (this round or
   earlier) / its cluster's median radius). A program within ``duplicate_radius`` of a chosen
   one is a near-duplicate and is taken only when nothing else is left. An optional
   ``w_p·P`` (weight ``performance``, not in the paper) adds P = the rank in [0, 1] of the current
   model's predicted score among the pool's programs of the same task (1: predicted fastest);
   0 while no model predicts.

Time per round O(N·k·d) for the clusters and O(pool·d·budget/k) for the greedy choice; memory
O(N·d): no pairwise matrix of programs is ever built.
"""

from __future__ import annotations

import math

import numpy as np

from tcl.sampling import space
from tcl.sampling.base import RoundState, Sampler


class RDUSampler(Sampler):
    name = "rdu"

    def choose(self, state: RoundState, budget: int) -> np.ndarray:
        s, view = self.settings, state.view
        w_r, w_d, w_u = (s.weights[k] for k in ("representativeness", "diversity", "uncertainty"))
        w_p = s.weights.get("performance", 0.0)
        unchosen = state.unchosen
        emb = view.embedding
        clusters = view.clusters(min(budget, s.max_clusters), rows=unchosen)
        k = clusters.k

        # cells: the clusters, split by task when stratified (tasks are known before measuring)
        label = clusters.label[unchosen].astype(np.int64)
        stratum = (state.pool.task[unchosen].astype(np.int64) if s.stratify == "task"
                   else np.zeros(len(unchosen), np.int64))
        cells, cell = np.unique(stratum * k + label, return_inverse=True)
        cell_stratum, cell_cluster = cells // k, cells % k
        sizes = np.bincount(cell, minlength=len(cells))

        # 1. representativeness pass: each cell's programs nearest their centre, pool_ratio of them
        keep = space.allocate_nested(max(budget, math.ceil(s.pool_ratio * len(unchosen))), sizes, cell_stratum, sizes)
        order = np.lexsort((clusters.dist[unchosen], cell))                  # by cell, nearest first
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]])
        rank = np.arange(len(order)) - starts[cell[order]]                   # rank within its cell
        kept = rank < keep[cell[order]]
        candidates = unchosen[order[kept]]                                   # grouped by cell
        rep = 1.0 - rank[kept] / sizes[cell[order[kept]]]
        self.last_candidates = candidates

        # 2. uncertainty of the pool, then diversity + uncertainty choose per cell
        unc = view.uncertainty(candidates) if w_u > 0 else None
        unc = np.zeros(len(candidates)) if unc is None else unc
        base = w_r * rep + w_u * unc
        perf = space.task_rank01(view.predicted(candidates), state.pool.task[candidates]) if w_p > 0 else None
        if perf is not None:
            base = base + w_p * perf
        quota = space.allocate_nested(budget, sizes, cell_stratum, keep)
        radius = clusters.radius()[cell_cluster]
        chosen_key = ((state.pool.task[state.chosen].astype(np.int64) if s.stratify == "task" else 0) * k
                      + clusters.label[state.chosen])
        earlier = state.chosen[np.argsort(chosen_key, kind="stable")]        # chosen before, grouped by cell
        bounds = np.searchsorted(np.sort(chosen_key), np.stack([cells, cells + 1]))
        offsets = np.concatenate([[0], np.cumsum(keep)])
        picked, picked_d, duplicates = [], [], 0
        for c in np.flatnonzero(quota):
            lo, hi = offsets[c], offsets[c + 1]
            e = emb[candidates[lo:hi]]                                       # (m, d)
            before = emb[earlier[bounds[0, c]:bounds[1, c]]]                 # programs of the cell chosen earlier
            dmin = np.full(hi - lo, np.inf, np.float32)
            for a in range(0, len(before), 1024):
                dmin = np.minimum(dmin, _distances(e, before[a:a + 1024]).min(axis=1))
            open_ = np.ones(hi - lo, bool)
            for _ in range(quota[c]):
                div = np.minimum(dmin / radius[c], 1.0)
                score = base[lo:hi] + w_d * div
                score[~open_] = -np.inf
                dup = dmin < s.duplicate_radius * radius[c]
                if (open_ & ~dup).any():
                    score[dup] = -np.inf
                else:
                    duplicates += 1
                j = int(np.argmax(score))
                open_[j] = False
                picked.append(lo + j)
                picked_d.append(float(div[j]))
                dmin = np.minimum(dmin, np.sqrt(((e - e[j]) ** 2).sum(axis=1)))
        picked = np.asarray(picked, np.int64)
        state.record.update({
            "pool": int(len(unchosen)), "candidates": int(len(candidates)), "clusters": int(k),
            "cells": int(len(cells)),
            "near_duplicates": duplicates,
            "scores": {"representativeness": float(rep[picked].mean()), "diversity": float(np.mean(picked_d)),
                       "uncertainty": float(unc[picked].mean()),
                       **({"performance": float(perf[picked].mean())} if perf is not None else {})},
        })
        return candidates[picked]


def _distances(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(len(a), len(b)) Euclidean distances."""
    d2 = (a ** 2).sum(axis=1)[:, None] - 2.0 * (a @ b.T) + (b ** 2).sum(axis=1)[None, :]
    return np.sqrt(np.maximum(d2, 0.0))
