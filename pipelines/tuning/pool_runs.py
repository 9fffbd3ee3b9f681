"""The tuning study's runs of several occasions pooled: per task, every run of every cost model
(seeds x occasions) read back from its tuning database, the geometric-mean best-latency curve over
all of them, and TCL's trial speedup at equal latency and latency ratio at equal trials against
each baseline from those pooled curves (tcl.bench.tune.ratios, the study's definitions; seconds
are not in the databases, so only trials are compared).

Each ROOT is a study's `pipelines/tuning/runs` (one folder per task, `<model>-seed<s>` inside:
the databases `tcl tune` writes, records in measurement order), or a folder of a study's metrics
(`pipelines/tuning/metrics`: one `tcl bench tune --json` report per task), whose per-model curves
are already the geometric mean over the report's seeds and count as that many runs (the pooled
geometric mean is then the same as from the runs). An earlier occasion's runs come back with its
commit's dvc.lock: `git worktree add /tmp/old <commit> && cd /tmp/old && dvc checkout
pipelines/tuning/dvc.yaml` (from a DVC cache that holds them); its metrics are in git
(`git worktree add /tmp/old <commit>`: /tmp/old/pipelines/tuning/metrics).

    python pipelines/tuning/pool_runs.py pipelines/tuning/runs /tmp/old/pipelines/tuning/metrics \
        --every 16 --markdown /tmp/pooled.md
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from tcl.bench.tune import TCL_VARIANTS, mean_curve, ratios
from tcl.io import atomic_write_text
from tcl.records import FAILED_LATENCY


def latencies(db: Path) -> list[float]:
    """Mean measured latency of each record of a run's database, in measurement order (inf: failed)."""
    out = []
    for line in (db / "database_tuning_record.json").read_text().splitlines():
        secs = [float(s) for s in json.loads(line)[1][1] or []]
        out.append(sum(secs) / len(secs) if secs and max(secs) < FAILED_LATENCY else math.inf)
    return out


def run_curve(db: Path, every: int) -> dict:
    """Best mean latency after every `every` trials of one run (inf: nothing valid yet)."""
    best, curve_trials, curve_best = math.inf, [], []
    lats = latencies(db)
    for n, latency in enumerate(lats, 1):
        best = min(best, latency)
        if n % every == 0 or n == len(lats):
            curve_trials.append(n)
            curve_best.append(best)
    return {"trials": curve_trials, "best": curve_best, "seconds": curve_trials}


def report_curves(report: dict, every: int) -> dict:
    """{model: [its mean curve, once per seed]} of one `tcl bench tune --json` report."""
    out = {}
    for model, curve in report["curves"].items():
        trials = curve["trials"]
        if len(trials) > 1 and trials[1] - trials[0] != every:
            raise SystemExit(f"{report['workload']}: the report's curves step {trials[1] - trials[0]} trials, "
                             f"not --every {every}")
        point = {"trials": trials, "best": curve["best_latency_s"], "seconds": trials}
        out[model] = [point] * len(report["seeds"])
    return out


def pooled(roots: list[Path], every: int) -> dict:
    """{task: {model: [run curves]}} over every root."""
    out: dict = {}
    for root in roots:
        reports = sorted(root.glob("*.json"))
        for path in reports:  # a metrics folder: one report per task
            report = json.loads(path.read_text())
            for model, curves in report_curves(report, every).items():
                out.setdefault(report["workload"], {}).setdefault(model, []).extend(curves)
        if reports:
            continue
        for task_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            for run_dir in sorted(p for p in task_dir.iterdir() if (p / "database_tuning_record.json").exists()):
                model = run_dir.name.rsplit("-seed", 1)[0]
                out.setdefault(task_dir.name, {}).setdefault(model, []).append(run_curve(run_dir, every))
    return out


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def table(runs: dict) -> str:
    lines = ["| task | TCL | baseline | runs | final latency TCL / baseline (µs) | speedup (trials) "
             "| latency ratio |", "|---|---|---|---|---|---|---|"]
    overall: dict = {}
    for task, models in sorted(runs.items()):
        curves = {m: mean_curve(c) for m, c in models.items()}
        for variant in (v for v in TCL_VARIANTS if v in curves):
            for base, r in sorted(ratios(curves, variant).items()):
                speed = r["speedup_trials"]
                overall.setdefault((variant, base), []).append((speed, r["latency_ratio_at_equal_trials"]))
                lines.append(f"| {task} | {variant} | {base} | {len(models[variant])} / {len(models[base])} | "
                             f"{1e6 * curves[variant][1][-1]:.1f} / {1e6 * curves[base][1][-1]:.1f} | "
                             f"{'not reached' if speed is None else f'{speed:.2f}x'} | "
                             f"{r['latency_ratio_at_equal_trials']:.3f} |")
    lines += ["", "| TCL | baseline | tasks | reached | speedup (trials, geometric mean where reached) "
              "| latency ratio |", "|---|---|---|---|---|---|"]
    for (variant, base), rows in sorted(overall.items()):
        speeds = [s for s, _ in rows if s is not None]
        g = geomean(speeds)
        lines.append(f"| {variant} | {base} | {len(rows)} | {len(speeds)} | "
                     f"{'-' if g is None else f'{g:.2f}x'} | {geomean([r for _, r in rows]):.3f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="+", type=Path, help="study run folders (pipelines/tuning/runs)")
    ap.add_argument("--every", type=int, default=16, help="trials per curve point (the study's batch)")
    ap.add_argument("--models", default=None,
                    help="comma-separated cost models to pool (default: all); pool only models run on "
                         "every occasion, as many runs each: then an occasion's machine speed scales "
                         "every pooled curve alike and cancels in the ratios")
    ap.add_argument("--markdown", type=Path, default=None)
    args = ap.parse_args()
    runs = pooled(args.roots, args.every)
    if args.models:
        keep = set(args.models.split(","))
        runs = {task: {m: c for m, c in models.items() if m in keep} for task, models in runs.items()}
    text = table(runs)
    print(text, end="")
    if args.markdown:
        atomic_write_text(args.markdown, text)


if __name__ == "__main__":
    main()
