"""Where each cost model's measurements land: per task, model and window of trials, the median
measured latency over the run's final best, and how many measurements came within 2 % of it
(summed over the model's seeds). A cost model that keeps learning the task (MetaSchedule's
XGBoost, online) spends its late batches near the best; one that does not keeps measuring
candidates it ranks high but the task does not.

Each ROOT is a study's runs folder (one folder per task, `<model>-seed<s>` inside: the tuning
databases, records in measurement order); a model's runs in several ROOTs (occasions) are pooled.

    python pipelines/tuning/landing.py pipelines/tuning/runs-long --windows 0,64,128,256
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path
from statistics import median

from pool_runs import latencies  # this folder's (the script's directory is on sys.path)

from tcl.io import atomic_write_text


def landing(roots: list[Path], windows: list[int]) -> list[dict]:
    """One row per (task, model, window), a model's runs pooled over every root (occasion):
    median / best over its runs, and the count within 2 % of each run's own best."""
    runs: dict = {}
    for root in roots:
        for task_dir in (p for p in root.iterdir() if p.is_dir()):
            for run in sorted(p for p in task_dir.iterdir() if (p / "database_tuning_record.json").exists()):
                runs.setdefault((task_dir.name, run.name.rsplit("-seed", 1)[0]), []).append(latencies(run))
    rows = []
    for (task, model), lats in sorted(runs.items()):
        for lo, hi in zip(windows, windows[1:]):
            ratios, near, n = [], 0, 0
            for lat in lats:
                best = min(lat)
                seg = [v for v in lat[lo:hi] if math.isfinite(v)]
                ratios += [v / best for v in seg]
                near += sum(v < 1.02 * best for v in seg)
                n += len(lat[lo:hi])
            if n:
                rows.append({"task": task, "model": model, "runs": len(lats), "trials": f"{lo + 1}-{hi}",
                             "median_over_best": median(ratios) if ratios else None, "within_2pct": near,
                             "measured": n})
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| task | model | runs | trials | median latency / run's best | measured within 2 % of it |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        med = "-" if r["median_over_best"] is None else f"{r['median_over_best']:.2f}"
        lines.append(f"| {r['task']} | {r['model']} | {r['runs']} | {r['trials']} | {med} | "
                     f"{r['within_2pct']} of {r['measured']} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="+", type=Path, help="study run folders (pipelines/tuning/runs-long)")
    ap.add_argument("--windows", default="0,64,128,256", help="window bounds in trials")
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()
    text = table(landing(args.roots, [int(w) for w in args.windows.split(",")]))
    print(text, end="")
    if args.markdown:
        atomic_write_text(args.markdown, text)


if __name__ == "__main__":
    main()
