"""What the cross-validated KD guard reads against what the held-out networks say (docs/continual.md,
*A cross-validated KD guard*), from `tcl ckd-study run --variant ckd-cv` JSON files:

per family and target KD epoch, the change from the source KB (mean ± sd over the runs) of
(1) the folds' pairwise accuracy on the subset's own tasks (the guard's cross-validated view),
(2) the target's pairwise accuracy the guard reads (validation tasks and fold tasks, each task once),
(3) top-1 on the target's held-out networks (the run's test curves; reported only, never read by a run).

    python pipelines/continual/plot_guard_cv.py pipelines/continual/metrics/*-ckd-cv-same-s*.json \
        pipelines/continual/rerun-2026-12-06/*-ckd-cv-same-s*.json --png docs/img/ckd_guard_cv.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import numpy as np

from tcl.io import atomic_write_bytes
from tcl.summary import figure_png


def deltas(run: dict) -> dict[str, list[float]]:
    """The three series of one ckd-cv run, each as the change from its value for the source KB."""
    guard, target = run["kd_guard"], run["platform"]
    test = [c["top1"][target] for c in run["curves"] if c["learning"] == target and c["phase"] == "kd"]
    return {"subset tasks, cross-validated (pairwise)": [v - guard["cv"]["start"] for v in guard["cv"]["epochs"]],
            "what the guard reads (pairwise)": [r["guard_target"] - guard["start_valid"] for r in run["kd_guard_epochs"]],
            "held-out networks (top-1)": [v - run["target_before"]["top1"] for v in test]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="ckd-cv runs' JSON files")
    ap.add_argument("--png", required=True)
    args = ap.parse_args()
    by_family: dict[str, list[dict]] = defaultdict(list)
    for path in args.runs:
        run = json.loads(open(path).read())
        if run.get("variant") != "ckd-cv":
            raise SystemExit(f"{path}: a {run.get('variant')!r} run, not ckd-cv")
        by_family[run["family"]].append(run)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(by_family), figsize=(7.0 * len(by_family), 4.5), squeeze=False)
    for ax, (family, runs) in zip(axes[0], sorted(by_family.items())):
        series = [deltas(r) for r in runs]
        for name in series[0]:
            n = min(len(s[name]) for s in series)
            values = np.array([s[name][:n] for s in series])
            mean, sd = values.mean(axis=0), values.std(axis=0)
            epochs = np.arange(1, n + 1)
            ax.plot(epochs, mean, label=name)
            ax.fill_between(epochs, mean - sd, mean + sd, alpha=0.15)
        ax.axhline(0.0, color="k", lw=0.8)
        ax.set_xlabel("target KD epoch")
        ax.set_ylabel("change from the source KB (mean ± sd)")
        ax.set_title(f"{family} → {runs[0]['platform']}: {len(runs)} seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    atomic_write_bytes(args.png, figure_png(fig))


if __name__ == "__main__":
    main()
