"""What each strategy's subsets of the 512-a-task pool hold (issue 12; session 46, descriptive): the
programs a subset takes from each operator kind of the pool's tasks, and the share of its programs among
their task's fastest 10% (labels read after the choice, only to describe it). Mean over subsets 0..n-1.

    python pipelines/newplatform/poolsize/trainseeds/subset_mix.py --subsets runs/poolsize-rounds6 \
        --pool pipelines/newplatform/data/split-pool512/train.npz --ratio 0.1 --n 24
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from tcl.features import FeatureSet

STRATEGIES = ("rdu", "kmeans", "random")


def latency_percentile(pool: FeatureSet) -> np.ndarray:
    """Each program's rank among its task's programs by latency, 0 (fastest) to 1 (slowest)."""
    pct = np.zeros(len(pool))
    for t in np.unique(pool.task):
        rows = np.flatnonzero(pool.task == t)
        pct[rows] = np.argsort(np.argsort(pool.latency[rows], kind="stable")) / max(len(rows) - 1, 1)
    return pct


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--subsets", type=Path, required=True, help="folder of <strategy>-<ratio>-s<seed>.npz")
    ap.add_argument("--pool", type=Path, required=True)
    ap.add_argument("--ratio", type=float, default=0.1)
    ap.add_argument("--n", type=int, default=24, help="subsets 0..n-1 of each strategy")
    args = ap.parse_args()

    pool = FeatureSet.load(args.pool)
    row_of = {p: i for i, p in enumerate(pool.program_id)}
    pct = latency_percentile(pool)
    kind = np.array([desc.split(" ")[0] for desc in pool.task_desc])[pool.task]   # conv2d, dense, ...
    kinds = sorted(set(kind))
    print(f"| strategy | programs | fastest 10% of their task | " + " | ".join(kinds) + " |")
    print("|---|---:|---:|" + "---:|" * len(kinds))
    for strategy in STRATEGIES:
        counts, fast, sizes = [], [], []
        for seed in range(args.n):
            sub = FeatureSet.load(args.subsets / f"{strategy}-{args.ratio:g}-s{seed}.npz")
            rows = np.array([row_of[p] for p in sub.program_id])
            sizes.append(len(rows))
            fast.append(float((pct[rows] < 0.1).mean()))
            counts.append([int((kind[rows] == k).sum()) for k in kinds])
        mean = np.mean(counts, axis=0)
        print(f"| {strategy} | {np.mean(sizes):.0f} | {np.mean(fast):.3f} | "
              + " | ".join(f"{c:.1f}" for c in mean) + " |")


if __name__ == "__main__":
    main()
