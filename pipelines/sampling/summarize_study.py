"""The sampling study's summary (issue 12, item 6): held-out top-1 / top-5 (network and per task)
per platform, strategy and sampling ratio, mean ± sd over seeds, the sampler's own seconds beside
each (the subset's meta["sample"]), as a Markdown table, a DVC metrics JSON, `dvc plots` rows and
a PNG (top-1 vs ratio, one line per strategy, the 100% model as a band).

Reads the pipeline's files: METRICS/<platform>-<strategy>-<ratio>-s<seed>.json (`tcl evaluate
--out`, labelled "<strategy>-<ratio>"; the 100% model "full-1.0") and SUBSETS/<same stem>.npz.

    python pipelines/sampling/summarize_study.py --metrics pipelines/sampling/metrics \
        --subsets pipelines/sampling/subsets --out summary.json --markdown summary.md \
        --plot plots/top1.json --png docs/img/sampling_study.png
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from tcl.features import load_feature_set
from tcl.io import atomic_write_bytes, atomic_write_json, atomic_write_text
from tcl.sampling import STRATEGIES
from tcl.summary import as_metrics, figure_png, stats, summarize

FULL = "full"
COLUMNS = ("top1", "top5", "task_top1", "task_top5")


def load_runs(metrics_dir: Path, subsets_dir: Path) -> list[dict]:
    """Every evaluated run with its strategy, ratio and (for a subset) the sampler's seconds."""
    runs = []
    for path in sorted(metrics_dir.glob("*.json")):
        try:
            result = json.loads(path.read_text())
            strategy, ratio = result["label"].rsplit("-", 1)
            ratio = float(ratio)
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise SystemExit(f"{path}: not a study metrics file with a '<strategy>-<ratio>' label ({exc!r})")
        seconds = None
        if strategy != FULL:
            subset = subsets_dir / f"{path.stem}.npz"
            seconds = float(load_feature_set(subset).meta["sample"]["seconds"])
        runs.append({**result, "strategy": strategy, "ratio": ratio, "sampler_seconds": seconds})
    if not runs:
        raise SystemExit(f"{metrics_dir}: no metrics files")
    return runs


def study_rows(runs: list[dict]) -> list[dict]:
    """tcl.summary rows (mean/sd/min/max per metric over seeds) with strategy, ratio and the
    sampler's seconds, ordered by platform, ratio, then tcl.sampling.STRATEGIES (others after)."""
    seconds = defaultdict(list)
    for r in runs:
        if r["sampler_seconds"] is not None:
            seconds[(r["platform"], r["label"])].append(r["sampler_seconds"])
    order = {s: i for i, s in enumerate(dict.fromkeys([*STRATEGIES, FULL, *sorted(r["strategy"] for r in runs)]))}
    rows = []
    for row in summarize(runs):
        strategy, ratio = row["model"].rsplit("-", 1)
        key = (row["platform"], row["model"])
        rows.append({**row, "strategy": strategy, "ratio": float(ratio),
                     "sampler_seconds": stats(seconds[key]) if seconds[key] else None})
    rows.sort(key=lambda r: (r["platform"], r["ratio"], order[r["strategy"]]))
    return rows


def format_table(rows: list[dict]) -> str:
    lines = ["| platform | strategy | ratio | seeds | top-1 | top-5 | task top-1 | task top-5 | sampler s |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cells = [f"{r[k]['mean']:.3f} ± {r[k]['sd']:.3f}" if r.get(k) else "-" for k in COLUMNS]
        s = r["sampler_seconds"]
        sec = f"{s['mean']:.2f} ± {s['sd']:.2f}" if s else "-"
        lines.append(f"| {r['platform']} | {r['strategy']} | {r['ratio'] * 100:g}% | {r['n_runs']} | "
                     + " | ".join(cells) + f" | {sec} |")
    return "\n".join(lines) + "\n"


def metrics_json(rows: list[dict]) -> dict:
    """as_metrics (means, top-k sd) per platform and "<strategy>-<ratio>", plus the sampler's mean seconds."""
    out = as_metrics(rows)
    for r in rows:
        if r["sampler_seconds"]:
            out[r["platform"]][r["model"]]["sampler_seconds"] = round(r["sampler_seconds"]["mean"], 3)
    return out


def plot_rows(rows: list[dict]) -> list[dict]:
    """Wide rows for `dvc plots` (one line per y field): {ratio (%), <strategy>: mean top-1, ...},
    the 100% model's mean at every ratio; fields are "<platform> <strategy>" with several platforms."""
    platforms = sorted({r["platform"] for r in rows})
    full = {r["platform"]: r["top1"]["mean"] for r in rows if r["strategy"] == FULL}
    table: dict[float, dict] = defaultdict(dict)
    for r in rows:
        if r["strategy"] == FULL:
            continue
        name = r["strategy"] if len(platforms) == 1 else f"{r['platform']} {r['strategy']}"
        table[r["ratio"]][name] = round(r["top1"]["mean"], 4)
        if r["platform"] in full:
            table[r["ratio"]][FULL if len(platforms) == 1 else f"{r['platform']} {FULL}"] = round(full[r["platform"]], 4)
    return [{"ratio": round(ratio * 100, 4), **table[ratio]} for ratio in sorted(table)]


def plot_png(rows: list[dict]) -> bytes:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    platforms = sorted({r["platform"] for r in rows})
    fig, axes = plt.subplots(1, len(platforms), figsize=(7 * len(platforms), 4.5), squeeze=False)
    for ax, platform in zip(axes[0], platforms):
        mine = [r for r in rows if r["platform"] == platform]
        for r in mine:
            if r["strategy"] == FULL:
                m, sd = r["top1"]["mean"], r["top1"]["sd"]
                ax.axhspan(m - sd, m + sd, color="grey", alpha=0.25)
                ax.axhline(m, color="grey", lw=1.5, label=f"100% ({r['n_runs']} seeds, mean ± sd)")
        strategies = list(dict.fromkeys(r["strategy"] for r in mine if r["strategy"] != FULL))
        for i, strategy in enumerate(strategies):
            pts = [r for r in mine if r["strategy"] == strategy]
            shift = 1 + 0.03 * (i - (len(strategies) - 1) / 2)  # side by side on the log axis
            ax.errorbar([r["ratio"] * 100 * shift for r in pts], [r["top1"]["mean"] for r in pts],
                        yerr=[r["top1"]["sd"] for r in pts], marker="o", capsize=3, label=strategy)
        ax.set_xscale("log")
        ratios = sorted({r["ratio"] * 100 for r in mine if r["strategy"] != FULL})
        ax.set_xticks(ratios, [f"{x:g}%" for x in ratios])
        ax.minorticks_off()
        ax.set_xlabel("sampling ratio of the train split")
        ax.set_ylabel("held-out top-1 (mean ± sd over seeds)")
        ax.set_title(f"{platform}: Mamba kb trained on each strategy's subset")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower right")
    return figure_png(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--metrics", required=True, type=Path)
    ap.add_argument("--subsets", required=True, type=Path)
    ap.add_argument("--out", required=True, help="DVC metrics JSON")
    ap.add_argument("--markdown", required=True)
    ap.add_argument("--plot", required=True, help="rows for `dvc plots` (JSON)")
    ap.add_argument("--png", required=True)
    a = ap.parse_args()
    rows = study_rows(load_runs(a.metrics, a.subsets))
    table = format_table(rows)
    atomic_write_json(a.out, metrics_json(rows))
    atomic_write_text(a.markdown, table)
    atomic_write_json(a.plot, plot_rows(rows))
    Path(a.png).parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(a.png, plot_png(rows))
    print(table, end="")


if __name__ == "__main__":
    main()
