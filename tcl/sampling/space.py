"""The space programs are compared in: embeddings, their projection, and K-Means clusters.

* Cold embedding (no model yet): the mean of a program's real step rows (F numbers: the share of
  each primitive kind, the mean signed-log2 arguments, the string tokens) and log(1 + its number
  of steps). Fixed and label-free, so it serves before anything is measured.
* Model embedding: ``CostModel.embed``, the pooled representation the model scores from.
* Either is standardised per column and projected onto its leading principal components
  (``embed_dims``), fitted on a subsample: K-Means distances then cost O(N·k·d) with a small d.
* Clusters: scikit-learn's ``MiniBatchKMeans`` fitted on a subsample of at most ``fit_rows``
  programs, then every program assigned to its nearest centre in chunks: time O(N·k·d), memory
  O(N·d + chunk·k), never O(N²).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

CHUNK = 8192  # programs embedded / assigned at a time


def cold_embedding(x, mask: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """(N, F + 1) float32: mean of the real step rows, log(1 + number of steps)."""
    n, f = len(mask), x.shape[2]
    out = np.empty((n, f + 1), np.float32)
    for a in range(0, n, chunk):
        xs = np.asarray(x[a:a + chunk], np.float32)           # (c, L, F)
        m = np.asarray(mask[a:a + chunk], np.float32)         # (c, L)
        length = m.sum(axis=1)                                # (c,)
        out[a:a + len(m), :f] = np.einsum("clf,cl->cf", xs, m) / np.maximum(length, 1.0)[:, None]
        out[a:a + len(m), f] = np.log1p(length)
    return out


def model_embedding(model, x, mask: np.ndarray, chunk: int = CHUNK) -> np.ndarray:
    """(N, D) float32: the model's pooled representation, `chunk` programs at a time."""
    parts = [np.asarray(model.embed(np.asarray(x[a:a + chunk]), np.asarray(mask[a:a + chunk])), np.float32)
             for a in range(0, len(mask), chunk)]
    return np.concatenate(parts) if parts else np.zeros((0, 0), np.float32)


def project(raw: np.ndarray, dims: int, rng: np.random.Generator, fit_rows: int = 20_000) -> np.ndarray:
    """Standardise the columns of `raw` (N, D) and keep its `dims` leading principal components
    (fitted on at most `fit_rows` random rows); (N, min(dims, D)) float32."""
    raw = np.asarray(raw, np.float32)
    n, d = raw.shape
    rows = np.sort(rng.choice(n, size=min(n, fit_rows), replace=False)) if n > fit_rows else slice(None)
    sample = raw[rows].astype(np.float64)
    mean = sample.mean(axis=0)
    std = sample.std(axis=0)
    std[std < 1e-8] = 1.0  # constant columns carry nothing; keep them at zero
    if d <= dims or len(sample) <= dims:
        return ((raw - mean) / std).astype(np.float32)
    z = (sample - mean) / std
    # principal axes of the standardised sample (float64 SVD of a (fit_rows, D) matrix)
    _, _, vt = np.linalg.svd(z - z.mean(axis=0), full_matrices=False)
    w = (vt[:dims].T / std[:, None]).astype(np.float32)        # (D, dims): standardise then project
    shift = (mean @ w.astype(np.float64)).astype(np.float32)   # (dims,)
    out = np.empty((n, dims), np.float32)
    for a in range(0, n, 65536):
        out[a:a + 65536] = raw[a:a + 65536] @ w - shift
    return out


@dataclass
class Clusters:
    """K-Means clusters of a pool: each program's cluster and its distance to the centre."""

    label: np.ndarray     # (N,) int32
    dist: np.ndarray      # (N,) float32 Euclidean distance to its centre
    centres: np.ndarray   # (k, d) float32

    @property
    def k(self) -> int:
        return len(self.centres)

    def radius(self) -> np.ndarray:
        """(k,) median distance of each cluster's programs to its centre (> 0): the cluster's scale."""
        order = np.lexsort((self.dist, self.label))
        counts = np.bincount(self.label, minlength=self.k)
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        med = np.where(counts > 0, self.dist[order[np.minimum(starts + counts // 2, len(order) - 1)]], 0.0)
        positive = med[med > 0]
        return np.where(med > 0, med, positive.mean() if len(positive) else 1.0).astype(np.float32)


def nearest_centres(emb: np.ndarray, centres: np.ndarray, chunk: int = 65536) -> tuple[np.ndarray, np.ndarray]:
    """For each row of `emb`: (index of the nearest centre (int32), distance to it (float32))."""
    n = len(emb)
    label = np.empty(n, np.int32)
    dist = np.empty(n, np.float32)
    c2 = (centres.astype(np.float32) ** 2).sum(axis=1)  # (k,)
    for a in range(0, n, chunk):
        e = emb[a:a + chunk]
        d2 = (e ** 2).sum(axis=1)[:, None] - 2.0 * (e @ centres.T) + c2[None, :]  # (c, k)
        j = np.argmin(d2, axis=1)
        label[a:a + len(e)] = j
        dist[a:a + len(e)] = np.sqrt(np.maximum(d2[np.arange(len(e)), j], 0.0))
    return label, dist


def kmeans(emb: np.ndarray, k: int, seed: int, fit_rows: int = 20_000,
           weight: np.ndarray | None = None, rows: np.ndarray | None = None) -> Clusters:
    """MiniBatchKMeans with `k` clusters fitted on at most `fit_rows` programs of `rows` (default:
    all; `weight` aligned with `rows`), then every program of `emb` assigned to its nearest centre."""
    from sklearn.cluster import MiniBatchKMeans

    rows = np.arange(len(emb)) if rows is None else np.asarray(rows)
    k = int(max(1, min(k, len(rows))))
    rng = np.random.default_rng(seed)
    pos = np.sort(rng.choice(len(rows), size=min(len(rows), max(fit_rows, 3 * k)), replace=False))
    km = MiniBatchKMeans(n_clusters=k, batch_size=min(4096, len(pos)), n_init=3, max_iter=50,
                         random_state=int(seed) % (2**31 - 1), compute_labels=False)
    km.fit(emb[rows[pos]], sample_weight=None if weight is None else np.asarray(weight, np.float64)[pos])
    centres = km.cluster_centers_.astype(np.float32)
    label, dist = nearest_centres(emb, centres)
    return Clusters(label=label, dist=dist, centres=centres)


def rank01(values: np.ndarray) -> np.ndarray:
    """Ranks scaled to [0, 1] (ties keep their order of appearance); a constant array -> zeros."""
    values = np.asarray(values, np.float64)
    if len(values) < 2 or np.ptp(values) == 0:
        return np.zeros(len(values))
    ranks = np.empty(len(values))
    ranks[np.argsort(values, kind="stable")] = np.arange(len(values))
    return ranks / (len(values) - 1)


def task_rank01(score: np.ndarray | None, task: np.ndarray) -> np.ndarray | None:
    """Each program's rank of `score` among the programs of its task, scaled to [0, 1] (1: the
    highest; a task of one program: 0). None when there is no score."""
    if score is None:
        return None
    order = np.lexsort((np.asarray(score, np.float64), task))           # by task, then score
    sizes = np.bincount(task[order])[task[order]]
    first = np.searchsorted(task[order], task[order])                   # each row's task's first position
    out = np.zeros(len(score))
    out[order] = np.where(sizes > 1, (np.arange(len(order)) - first) / np.maximum(sizes - 1, 1), 0.0)
    return out


def allocate(total: int, weight: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """`total` picks over clusters in proportion to `weight` (largest remainder), cluster i taking
    at most cap[i]; what a full cluster cannot take goes to the others. (k,) int64."""
    weight = np.asarray(weight, np.float64)
    cap = np.asarray(cap, np.int64)
    q = np.zeros(len(cap), np.int64)
    remaining = min(int(total), int(cap.sum()))
    while remaining > 0:
        open_ = np.flatnonzero((q < cap) & (weight > 0))
        if len(open_) == 0:
            open_ = np.flatnonzero(q < cap)
            w = np.ones(len(open_))
        else:
            w = weight[open_]
        share = remaining * w / w.sum()
        add = np.minimum(np.floor(share).astype(np.int64), cap[open_] - q[open_])
        if add.sum() == 0:  # less than one pick each: the largest remainders get one
            order = open_[np.argsort(-(share - np.floor(share)), kind="stable")]
            add_to = order[:remaining]
            q[add_to] += 1
            remaining -= len(add_to)
            continue
        q[open_] += add
        remaining -= int(add.sum())
    return q


def allocate_nested(total: int, weight: np.ndarray, stratum: np.ndarray, cap: np.ndarray) -> np.ndarray:
    """`allocate` in two levels: over the strata (in proportion to their summed weight), then
    inside each stratum over its members."""
    stratum = np.asarray(stratum, np.int64)
    n_strata = int(stratum.max()) + 1 if len(stratum) else 0
    per_stratum = allocate(total, np.bincount(stratum, weights=weight, minlength=n_strata),
                                          np.bincount(stratum, weights=cap, minlength=n_strata).astype(np.int64))
    q = np.zeros(len(cap), np.int64)
    for g, members in enumerate(group_by(stratum, n_strata)):
        if per_stratum[g]:
            q[members] = allocate(per_stratum[g], np.asarray(weight)[members], np.asarray(cap)[members])
    return q


def group_by(label: np.ndarray, k: int) -> list[np.ndarray]:
    """Positions of each cluster's members: [positions where label == c for c in range(k)]."""
    order = np.argsort(label, kind="stable")
    return np.split(order, np.cumsum(np.bincount(label, minlength=k))[:-1])
