"""Seed-averaged comparison of evaluated models: one row per (platform, model), mean and spread.

With ten held-out tasks, one task's pick moves top-1 by up to ~0.2, so one training run per model
decides little; the comparison pipeline trains every model with several seeds and this module
reduces the `tcl evaluate --out` JSON files to mean, standard deviation, min and max per metric.

    rows = summarize([json.load(open(p)) for p in paths])
    print(format_markdown(rows))
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Iterable

__all__ = ["METRICS", "stats", "summarize", "as_metrics", "format_markdown", "bar_rows"]

# task_top1/task_top5: the unweighted mean over tasks, beside the network-weighted top-k
METRICS = ("top1", "top5", "task_top1", "task_top5", "pairwise", "spearman")


def stats(values: list[float]) -> dict:
    """{mean, sd (sample, ddof 1; 0 for one value), min, max} of `values`."""
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n > 1 else 0.0
    return {"mean": mean, "sd": sd, "min": min(values), "max": max(values)}


def summarize(results: Iterable[dict]) -> list[dict]:
    """`tcl evaluate` results -> rows {platform, model (the result's label, else its kind), n_runs, <metric>: {mean, sd, min, max},
    per_network: {net: {top1: {...}, top5: {...}}}}, sorted by platform then mean top-1 (best first)."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in results:
        groups[(r.get("platform") or "?", r.get("label") or r.get("kind") or "?")].append(r)
    rows = []
    for (platform, model), runs in groups.items():
        row = {"platform": platform, "model": model, "n_runs": len(runs)}
        for key in METRICS:
            vals = [float(r[key]) for r in runs if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]
            if vals:
                row[key] = stats(vals)
        nets = sorted({n for r in runs for n in (r.get("per_network") or {})})
        row["per_network"] = {
            net: {k: stats([float(r["per_network"][net][k]) for r in runs if net in (r.get("per_network") or {})])
                  for k in ("top1", "top5")}
            for net in nets
        }
        rows.append(row)
    rows.sort(key=lambda r: (r["platform"], -(r.get("top1") or {}).get("mean", -math.inf), r["model"]))
    return rows


def as_metrics(rows: list[dict]) -> dict:
    """{platform: {model: {n_runs, top1, top1_sd, top5, top5_sd, pairwise, spearman}}}: the means
    (and top-k spreads) nested the way `dvc metrics show` flattens into columns."""
    out: dict = {}
    for r in rows:
        m = {"n_runs": r["n_runs"]}
        for key in METRICS:
            if r.get(key):
                m[key] = round(r[key]["mean"], 4)
                if key in ("top1", "top5"):
                    m[f"{key}_sd"] = round(r[key]["sd"], 4)
        out.setdefault(r["platform"], {})[r["model"]] = m
    return out


def format_markdown(rows: list[dict]) -> str:
    """A Markdown table: platform, model, runs, then mean ± sd (min–max for top-1) per metric;
    "task top-k" is the per-task mean (a result from before it existed shows "-")."""
    head = ("| platform | model | runs | top-1 | top-1 min–max | top-5 | task top-1 | task top-5 | pairwise "
            "| Spearman |")
    lines = [head, "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        def cell(key: str) -> str:
            s = r.get(key)
            return f"{s['mean']:.3f} ± {s['sd']:.3f}" if s else "-"
        t1 = r.get("top1")
        span = f"{t1['min']:.3f}–{t1['max']:.3f}" if t1 else "-"
        lines.append(f"| {r['platform']} | {r['model']} | {r['n_runs']} | {cell('top1')} | {span} | "
                     f"{cell('top5')} | {cell('task_top1')} | {cell('task_top5')} | {cell('pairwise')} | "
                     f"{cell('spearman')} |")
    return "\n".join(lines) + "\n"


def bar_rows(rows: list[dict]) -> list[dict]:
    """Flat rows for a `dvc plots` bar chart: {run: "<platform> <model>", top1, top5}."""
    return [{"run": f"{r['platform']} {r['model']}",
             "top1": round(r["top1"]["mean"], 4) if r.get("top1") else None,
             "top5": round(r["top5"]["mean"], 4) if r.get("top5") else None}
            for r in rows]


def figure_png(fig) -> bytes:
    """A matplotlib figure as PNG bytes (laid out, 110 dpi), the figure closed: the study
    summaries write them with tcl.io.atomic_write_bytes."""
    import io

    import matplotlib.pyplot as plt

    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return buf.getvalue()


def load_study_files(metrics_dir, fields: Iterable[str], what: str) -> list[dict]:
    """Every ``*.json`` of a study's metrics folder, in name order, each checked to hold `fields`;
    SystemExit naming the file for one that does not (`what`: the command that writes them)."""
    import json
    from pathlib import Path

    out = []
    for path in sorted(Path(metrics_dir).glob("*.json")):
        try:
            r = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SystemExit(f"{path}: cannot read it ({exc})")
        missing = [k for k in fields if not isinstance(r, dict) or k not in r]
        if missing:
            raise SystemExit(f"{path}: not a {what} metrics file (no {', '.join(missing)})")
        out.append(r)
    if not out:
        raise SystemExit(f"{metrics_dir}: no metrics files")
    return out
