"""What a minimum gain for the KD guard would have kept, read exactly off the committed runs.

The `target` guard keeps the KD epoch best on the target's validation score among those within the
sources' tolerance, or the KB KD started from when none beats it. Requiring an epoch to beat the start
by at least MARGIN keeps the same epoch when its gain reaches MARGIN and the start otherwise, so each
run's result under a margin is either its own (the kept epoch's) or its source KB's (`target_before`,
the sources unchanged): no run needs repeating. A diagnostic read off the test split, not a choice.

    python pipelines/continual/rerun-2026-12-07/guard_margin.py [--margins 0,0.002,0.005]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
FAMILIES = ("amd-zen4-avx512", "x86-sse")


def under_margin(run: dict, margin: float) -> dict:
    """The run's target top-1 / per-task top-1 and worst source drop had the guard required `margin`."""
    guard = run["kd_guard"]
    gain = guard["end_valid"] - guard["start_valid"]
    if run["kd_kept_start"] or gain < margin:
        before = run["target_before"]
        return {"top1": before["top1"], "task_top1": before["task_top1"], "drop": 0.0, "kept": True}
    return {"top1": run["top1"], "task_top1": run["task_top1"],
            "drop": max(run["sources_top1_drop"].values()), "kept": False}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--margins", default="0,0.001,0.002,0.005")
    ap.add_argument("--seeds", type=int, default=18)
    a = ap.parse_args()
    print("| family | margin | ckd top-1 | task top-1 | − scratch-100 (paired ± se) | worst source drop | seeds over 2 points | KD kept KB |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for family in FAMILIES:
        runs = [json.loads((HERE / f"{family}-ckd-same-s{s}.json").read_text()) for s in range(a.seeds)]
        scratch = [json.loads((HERE / f"{family}-scratch-100-same-s{s}.json").read_text())["top1"]
                   for s in range(a.seeds)]
        for margin in (float(m) for m in a.margins.split(",")):
            rows = [under_margin(r, margin) for r in runs]
            diff = [r["top1"] - s for r, s in zip(rows, scratch)]
            drops = [r["drop"] for r in rows]
            print(f"| {family} | {margin:g} | {statistics.fmean(r['top1'] for r in rows):.3f} "
                  f"| {statistics.fmean(r['task_top1'] for r in rows):.3f} "
                  f"| {statistics.fmean(diff):+.3f} ± {statistics.stdev(diff) / math.sqrt(len(diff)):.3f} "
                  f"| {max(drops):.3f} | {sum(d > 0.02 for d in drops)} | {sum(r['kept'] for r in rows)}/{len(rows)} |")


if __name__ == "__main__":
    main()
