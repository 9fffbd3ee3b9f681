"""What the cross-validated KD guard reads against what the held-out networks say (docs/continual.md,
*A cross-validated KD guard*), from `tcl ckd-study run --variant ckd-cv` JSON files:

per variant, family and target KD epoch, the change from the source KB (mean ± sd over the runs) of
(1) the folds' score on the subset's own tasks (the guard's cross-validated view, in its metric),
(2) the target's score the guard reads (validation tasks and fold tasks, each task once),
(3) top-1 on the target's held-out networks (the run's test curves; reported only, never read by a run).

    python pipelines/continual/plot_guard_cv.py pipelines/continual/metrics/*-ckd-cv-same-s*.json \
        pipelines/continual/rerun-2026-12-06/*-ckd-cv-same-s*.json --png docs/img/ckd_guard_cv.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

from tcl.io import atomic_write_bytes
from tcl.summary import figure_png


def deltas(run: dict) -> dict[str, list[float]]:
    """The three series of one ckd-cv run, each as the change from its value for the source KB."""
    guard, target = run["kd_guard"], run["platform"]
    metric = guard["cv"].get("metric", "pairwise")
    test = [c["top1"][target] for c in run["curves"] if c["learning"] == target and c["phase"] == "kd"]
    return {f"subset tasks, cross-validated ({metric})": [v - guard["cv"]["start"] for v in guard["cv"]["epochs"]],
            f"what the guard reads ({metric})": [r["guard_target"] - guard["start_valid"]
                                                for r in run["kd_guard_epochs"]],
            "held-out networks (top-1)": [v - run["target_before"]["top1"] for v in test]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="ckd-cv / ckd-cv-top1 runs' JSON files")
    ap.add_argument("--png", required=True)
    args = ap.parse_args()
    by_panel: dict[tuple, list[dict]] = defaultdict(list)  # (family, variant): its runs
    for path in args.runs:
        run = json.loads(Path(path).read_text())
        if not str(run.get("variant")).startswith("ckd-cv"):
            raise SystemExit(f"{path}: a {run.get('variant')!r} run, not a cross-validated guard's (ckd-cv*)")
        by_panel[run["family"], run["variant"]].append(run)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = sorted({v for _, v in by_panel})
    families = sorted({f for f, _ in by_panel})
    fig, axes = plt.subplots(len(variants), len(families), figsize=(7.0 * len(families), 4.5 * len(variants)),
                             squeeze=False)
    for (family, variant), runs in sorted(by_panel.items()):
        ax = axes[variants.index(variant)][families.index(family)]
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
        ax.set_title(f"{variant}, {family} → {runs[0]['platform']}: {len(runs)} seeds")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    atomic_write_bytes(args.png, figure_png(fig))


if __name__ == "__main__":
    main()
