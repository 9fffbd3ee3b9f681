"""The tuning study's summary (issue 14, item 4): per task and cost model, the final best latency
(geometric mean over seeds, with the seeds' spread), TCL's search-time speedup at equal latency and
latency ratio at equal trials against each baseline, their geometric means over the tasks, and
plots of best latency vs trials and vs seconds (one panel per task, one line per cost model).

Reads the pipeline's METRICS/<task>.json (`tcl bench tune --json`, tcl.bench.tune's report). The
ratios are recomputed from the reports' curves with tcl.bench.tune.ratios, so the summary always
states the current definition (2026-12-03: a baseline's trials to *first* reach its final
latency, not its whole budget) without re-tuning.

    python pipelines/tuning/summarize_study.py --metrics pipelines/tuning/metrics \
        --out pipelines/tuning/summary.json --markdown pipelines/tuning/summary.md \
        --png docs/img/tuning_study.png
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from tcl.bench.tune import TCL_VARIANTS, ratios
from tcl.io import atomic_write_bytes, atomic_write_json, atomic_write_text, json_safe
from tcl.summary import figure_png, load_study_files

REPORT_FIELDS = ("platform", "workload", "trials", "seeds", "curves", "runs")


def load_reports(metrics_dir: Path) -> list[dict]:
    return load_study_files(metrics_dir, REPORT_FIELDS, "`tcl bench tune --json`")


def geomean(values: list[float]) -> float | None:
    values = [v for v in values if v is not None and math.isfinite(v) and v > 0]
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else None


def seed_finals(report: dict, model: str) -> list[float]:
    """Each seed's final best latency of `model` (seconds; inf when nothing valid)."""
    finals = []
    for key, run in report["runs"].items():
        if key.split("/")[0] == model:
            best = [t["best_latency_s"] for t in run["tasks"]]
            finals.append(best[0] if best and best[0] is not None else math.inf)
    return finals


def study_ratios(report: dict) -> dict:
    """{TCL variant: {baseline: ratios}} from the report's mean curves."""
    curves = {n: (c["trials"], c["best_latency_s"], c["seconds"]) for n, c in report["curves"].items()}
    return {v: ratios(curves, v) for v in TCL_VARIANTS if v in curves}


def task_rows(reports: list[dict]) -> list[dict]:
    rows = []
    for rep in reports:
        row = {"task": rep["workload"], "platform": rep["platform"], "trials": rep["trials"],
               "seeds": rep["seeds"], "final_latency_s": {}, "seed_range_s": {},
               "ratios": study_ratios(rep)}
        for model, curve in rep["curves"].items():
            row["final_latency_s"][model] = curve["best_latency_s"][-1] if curve["best_latency_s"] else None
            finals = seed_finals(rep, model)
            row["seed_range_s"][model] = [min(finals), max(finals)] if finals else None
        cm = rep.get("cost_model")
        if cm:
            row["kb_candidates_per_s"] = cm["candidates_per_s"]
            row["kb_share_of_tuning"] = cm["share_of_tuning"]
        rows.append(row)
    return rows


def overall(rows: list[dict]) -> dict:
    """Per TCL variant and baseline: geometric means over the tasks of both ratios, and in how
    many tasks the variant reached the baseline's final latency at all (a speedup exists only
    there)."""
    out = {}
    for variant in TCL_VARIANTS:
        per_task = [r["ratios"][variant] for r in rows if variant in r["ratios"]]
        for b in sorted({b for x in per_task for b in x}):
            rs = [x[b] for x in per_task if b in x]
            out.setdefault(variant, {})[b] = {
                "tasks": len(rs),
                "reached": sum(x["speedup_trials"] is not None for x in rs),
                "speedup_trials_geomean_where_reached": geomean([x["speedup_trials"] for x in rs]),
                "speedup_seconds_geomean_where_reached": geomean([x["speedup_seconds"] for x in rs]),
                "latency_ratio_at_equal_trials_geomean": geomean([x["latency_ratio_at_equal_trials"] for x in rs])}
    return out


def fmt_us(v) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v * 1e6:.1f}"


def fmt_x(v) -> str:
    return "not reached" if v is None else f"{v:.2f}x"


def markdown(rows: list[dict], summary: dict) -> str:
    models = list(dict.fromkeys(m for r in rows for m in r["final_latency_s"]))
    out = ["Final best latency (µs; geometric mean over seeds, [min, max] of the seeds):", "",
           "| task | trials | " + " | ".join(models) + " |", "|---|---|" + "---|" * len(models)]
    for r in rows:
        cells = []
        for m in models:
            rng = r["seed_range_s"].get(m)
            spread = f" [{fmt_us(rng[0])}, {fmt_us(rng[1])}]" if rng and len(r["seeds"]) > 1 else ""
            cells.append(fmt_us(r["final_latency_s"].get(m)) + spread)
        out.append(f"| {r['task']} | {r['trials']} | " + " | ".join(cells) + " |")
    out += ["", "TCL (tcl: the KB as served; tcl-ft: fine-tuning on the run's measurements) against each "
            "baseline: search-time speedup at equal latency (trials; seconds) and latency ratio at equal "
            "trials (baseline / TCL; > 1: TCL better):", "",
            "| task | TCL | baseline | speedup (trials) | speedup (seconds) | latency ratio |", "|---|---|---|---|---|---|"]
    for r in rows:
        for variant, per_baseline in r["ratios"].items():
            for b, x in per_baseline.items():
                lr = x["latency_ratio_at_equal_trials"]
                out.append(f"| {r['task']} | {variant} | {b} | {fmt_x(x['speedup_trials'])} | "
                           f"{fmt_x(x['speedup_seconds'])} | {'-' if lr is None else f'{lr:.3f}'} |")
    out += ["", "Over the tasks (geometric means; the speedups over the tasks where TCL reached the "
            "baseline's final latency):", "",
            "| TCL | baseline | tasks | reached | speedup (trials) | speedup (seconds) | latency ratio |",
            "|---|---|---|---|---|---|---|"]
    for variant, per_baseline in summary.items():
        for b, s in per_baseline.items():
            lr = s["latency_ratio_at_equal_trials_geomean"]
            out.append(f"| {variant} | {b} | {s['tasks']} | {s['reached']} | "
                       f"{fmt_x(s['speedup_trials_geomean_where_reached'])} | "
                       f"{fmt_x(s['speedup_seconds_geomean_where_reached'])} | {'-' if lr is None else f'{lr:.3f}'} |")
    kb = [r for r in rows if r.get("kb_candidates_per_s")]
    if kb:
        out += ["", "The KB inside tuning: " + "; ".join(
            f"{r['task']} {r['kb_candidates_per_s']:.0f} candidates/s, {100 * r['kb_share_of_tuning']:.1f}% of wall time"
            for r in kb)]
    return "\n".join(out) + "\n"


def plot_png(reports: list[dict]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(reports), figsize=(4.2 * len(reports), 7), squeeze=False)
    for col, rep in enumerate(reports):
        for model, curve in rep["curves"].items():
            best = [b * 1e6 if b is not None and math.isfinite(b) else math.nan for b in curve["best_latency_s"]]
            axes[0][col].plot(curve["trials"], best, marker=".", label=model)
            axes[1][col].plot(curve["seconds"], best, marker=".", label=model)
        axes[0][col].set_title(rep["workload"], fontsize=9)
        axes[0][col].set_xlabel("trials")
        axes[1][col].set_xlabel("tuning seconds")
        for row in (0, 1):
            axes[row][col].set_yscale("log")
            axes[row][col].grid(alpha=0.3)
    axes[0][0].set_ylabel("best latency (µs), geo-mean over seeds")
    axes[1][0].set_ylabel("best latency (µs), geo-mean over seeds")
    axes[0][0].legend(fontsize=8)
    fig.suptitle(f"Tuning on {reports[0]['platform']}: best latency vs trials and vs seconds")
    return figure_png(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--metrics", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--markdown", type=Path, required=True)
    ap.add_argument("--png", type=Path)
    args = ap.parse_args()
    reports = load_reports(args.metrics)
    rows = task_rows(reports)
    summary = overall(rows)
    atomic_write_json(args.out, json_safe({"tasks": rows, "overall": summary}))
    atomic_write_text(args.markdown, markdown(rows, summary))
    if args.png:
        atomic_write_bytes(args.png, plot_png(reports))
    print(markdown(rows, summary))


if __name__ == "__main__":
    main()
