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

With `--bootstrap N` the tables get intervals: each resample draws, per task and cost model, as
many runs as there are with replacement, pools them as above and recomputes the speedups. So that
every resample has a figure over all tasks, a task on which TCL does not reach the baseline's
final latency counts at the speedup's upper bound there (the baseline's trials to its final
latency / TCL's whole budget: reaching it later would only lower it). The bootstrap needs one
curve per run, i.e. ROOTs of run folders, not metrics folders (whose per-seed curves are copies
of one mean curve): a metrics folder with --bootstrap is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path

import numpy as np

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


def root_spec(text: str) -> tuple[Path, set | None]:
    """A ROOT argument: `PATH`, or `PATH=M1,M2` (only those models' runs from that root)."""
    path, _, models = text.partition("=")
    return Path(path), set(models.split(",")) if models else None


def pooled(roots: list[Path | str], every: int, runs_only: bool = False) -> dict:
    """{task: {model: [run curves]}} over every root (`runs_only`: refuse a metrics folder); a root
    given as `PATH=M1,M2` contributes only those models."""
    out: dict = {}
    for spec in roots:
        root, only = root_spec(str(spec))
        reports = sorted(root.glob("*.json"))
        if reports and runs_only:
            raise SystemExit(f"{root}: a metrics folder holds one mean curve per task, not one per run: "
                             "give the study's run folders (pipelines/tuning/runs*)")
        for path in reports:  # a metrics folder: one report per task
            report = json.loads(path.read_text())
            for model, curves in report_curves(report, every).items():
                if only is not None and model not in only:
                    continue
                out.setdefault(report["workload"], {}).setdefault(model, []).extend(curves)
        if reports:
            continue
        for task_dir in sorted(p for p in root.iterdir() if p.is_dir()):
            for run_dir in sorted(p for p in task_dir.iterdir() if (p / "database_tuning_record.json").exists()):
                model = run_dir.name.rsplit("-seed", 1)[0]
                if only is not None and model not in only:
                    continue
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
                overall.setdefault((variant, base), []).append(
                    (speed, r["latency_ratio_at_equal_trials"], speedup_or_bound(curves, variant, base)))
                lines.append(f"| {task} | {variant} | {base} | {len(models[variant])} / {len(models[base])} | "
                             f"{1e6 * curves[variant][1][-1]:.1f} / {1e6 * curves[base][1][-1]:.1f} | "
                             f"{'not reached' if speed is None else f'{speed:.2f}x'} | "
                             f"{r['latency_ratio_at_equal_trials']:.3f} |")
    lines += ["", "| TCL | baseline | tasks | reached | speedup (trials, geometric mean where reached) "
              "| over all tasks (one not reached at its upper bound) | latency ratio |",
              "|---|---|---|---|---|---|---|"]
    for (variant, base), rows in sorted(overall.items()):
        speeds = [s for s, _, _ in rows if s is not None]
        g = geomean(speeds)
        lines.append(f"| {variant} | {base} | {len(rows)} | {len(speeds)} | "
                     f"{'-' if g is None else f'{g:.2f}x'} | {geomean([b for _, _, b in rows]):.2f}x | "
                     f"{geomean([r for _, r, _ in rows]):.3f} |")
    return "\n".join(lines) + "\n"


def speedup_or_bound(curves: dict, variant: str, base: str) -> float:
    """TCL's trial speedup against `base`; where it never reaches the baseline's final latency,
    the speedup's upper bound (the baseline's trials to its final latency / TCL's whole budget)."""
    r = ratios(curves, variant)[base]
    if r["speedup_trials"] is not None:
        return r["speedup_trials"]
    return r["baseline_trials_to_final"] / curves[variant][0][-1]


def bootstrap(runs: dict, resamples: int, seed: int) -> dict:
    """{(variant, base): {"tasks": [...], "all": point estimate over all tasks, "task": {task:
    point}, "samples": [over all tasks, one a resample], "task_samples": {task: [...]}}}: per
    resample, each task's runs of each model drawn with replacement (speedup_or_bound)."""
    rng = random.Random(seed)
    pairs = sorted({(v, b) for models in runs.values() for v in TCL_VARIANTS if v in models
                    for b in models if b not in TCL_VARIANTS})
    out = {}
    for variant, base in pairs:
        tasks = sorted(t for t, models in runs.items() if variant in models and base in models)
        point = {t: speedup_or_bound({m: mean_curve(runs[t][m]) for m in (variant, base)}, variant, base)
                 for t in tasks}
        task_samples: dict = {t: [] for t in tasks}
        samples = []
        for _ in range(resamples):
            for t in tasks:
                curves = {m: mean_curve([rng.choice(runs[t][m]) for _ in runs[t][m]]) for m in (variant, base)}
                task_samples[t].append(speedup_or_bound(curves, variant, base))
            samples.append(geomean([task_samples[t][-1] for t in tasks]))
        out[(variant, base)] = {"tasks": tasks, "task": point, "all": geomean(list(point.values())),
                                "samples": samples, "task_samples": task_samples}
    return out


def interval_table(boot: dict, runs: dict, resamples: int, seed: int, target: float = 3.0) -> str:
    lines = [f"Bootstrap over runs ({resamples} resamples, seed {seed}; a task not reached counts at its "
             "upper bound): trial speedup, point estimate from all runs, the resamples' median and 90% "
             f"interval (5th-95th percentile), share of resamples at or above {target:g}x.", "",
             "| TCL | baseline | task | runs | speedup | median | 90% interval | resamples >= "
             f"{target:g}x |", "|---|---|---|---|---|---|---|---|"]
    for (variant, base), b in sorted(boot.items()):
        rows = [(t, f"{len(runs[t][variant])} / {len(runs[t][base])}", b["task"][t], b["task_samples"][t])
                for t in b["tasks"]]
        rows.append((f"all {len(b['tasks'])} (geometric mean)", "", b["all"], b["samples"]))
        for task, n, point, samples in rows:
            share = sum(s >= target for s in samples) / len(samples)
            lines.append(f"| {variant} | {base} | {task} | {n} | {point:.2f}x | {np.quantile(samples, 0.5):.2f}x | "
                         f"{np.quantile(samples, 0.05):.2f}x - {np.quantile(samples, 0.95):.2f}x | {share:.0%} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("roots", nargs="+", help="study run folders (pipelines/tuning/runs); PATH=M1,M2 takes only "
                    "those models' runs from PATH (e.g. a setting's TCL runs beside the peers' of another folder)")
    ap.add_argument("--every", type=int, default=16, help="trials per curve point (the study's batch)")
    ap.add_argument("--models", default=None,
                    help="comma-separated cost models to pool (default: all); pool only models run on "
                         "every occasion, as many runs each: then an occasion's machine speed scales "
                         "every pooled curve alike and cancels in the ratios")
    ap.add_argument("--markdown", type=Path, default=None)
    ap.add_argument("--bootstrap", type=int, default=0, metavar="N",
                    help="add 90%% intervals of the speedups from N resamples of the runs (run folders only)")
    ap.add_argument("--bootstrap-seed", type=int, default=0)
    args = ap.parse_args()
    runs = pooled(args.roots, args.every, runs_only=args.bootstrap > 0)
    if args.models:
        keep = set(args.models.split(","))
        runs = {task: {m: c for m, c in models.items() if m in keep} for task, models in runs.items()}
    text = table(runs)
    if args.bootstrap > 0:
        boot = bootstrap(runs, args.bootstrap, args.bootstrap_seed)
        text += "\n" + interval_table(boot, runs, args.bootstrap, args.bootstrap_seed)
    print(text, end="")
    if args.markdown:
        atomic_write_text(args.markdown, text)


if __name__ == "__main__":
    main()
