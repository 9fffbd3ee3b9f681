"""One run label of this folder against others on the same seeds: the paired difference of the target's
held-out network and per-task top-1 (mean ± standard error over seeds, seeds above), and the sources'
worst drop. Run from the repository root, e.g. (sourcesets.sh's reading):

    python pipelines/continual/rerun-2026-12-07/paired.py x86-sse ckd-all --against ckd-sig-same,scratch-100-same,ckd-cross \
        --markdown pipelines/continual/rerun-2026-12-07/sourcesets-x86-sse.md

A run is <family>-<variant>-<sources>-s<seed>.json (`tcl ckd-study run --out`); a label is
<variant>-<sources>. Every figure is on the first label's seeds (and of those, the ones the other has)."""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

from tcl.io import atomic_write_text

HERE = Path(__file__).resolve().parent
METRICS = {"top1": "network top-1", "task_top1": "per-task top-1"}


def runs_of(folder: Path, family: str, label: str) -> dict[int, dict]:
    """seed -> run of one label."""
    name = re.compile(rf"{re.escape(family)}-{re.escape(label)}-s(\d+)\.json$")
    return {int(m[1]): json.loads(p.read_text()) for p in folder.glob("*.json") if (m := name.match(p.name))}


def mean_se(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else 0.0)


def worst_drop(run: dict) -> float | None:
    drops = (run.get("sources_top1_drop") or {}).values()
    return max(drops) if drops else None


def table(folder: Path, family: str, label: str, others: list[str]) -> str:
    mine = runs_of(folder, family, label)
    if not mine:
        raise SystemExit(f"paired.py: no {family}-{label}-s<seed>.json under {folder}")
    # every label on the first one's seeds only (and of those, the ones it has)
    runs = {name: {seed: r for seed, r in runs_of(folder, family, name).items() if seed in mine}
            for name in [label, *others]}
    lines = [f"{family}: {label} over seeds {min(mine)}-{max(mine)} ({len(mine)} runs)", "",
             "| run | seeds | network top-1 | per-task top-1 | worst source drop (points) |", "|---|---:|---:|---:|---:|"]
    for name, rs in runs.items():
        cells = [f"{statistics.fmean(r[k] for r in rs.values()):.3f}"
                 + (f" ± {statistics.stdev(r[k] for r in rs.values()):.3f}" if len(rs) > 1 else "") for k in METRICS]
        drops = [d for d in map(worst_drop, rs.values()) if d is not None]
        lines.append(f"| {name} | {len(rs)} | {cells[0]} | {cells[1]} | "
                     + (f"{100 * max(drops):.1f} |" if drops else "- |"))
    lines += ["", f"| {label} − it, paired by seed | seeds | network top-1 | seeds above | per-task top-1 | seeds above |",
              "|---|---:|---:|---:|---:|---:|"]
    for name in others:
        seeds = sorted(runs[name])
        if not seeds:
            continue
        row = [f"| {name} | {len(seeds)} "]
        for k in METRICS:
            d = [mine[s][k] - runs[name][s][k] for s in seeds]
            m, se = mean_se(d)
            row.append(f"| {m:+.3f} ± {se:.3f} | {sum(x > 0 for x in d)} of {len(d)} ")
        lines.append("".join(row) + "|")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("family")
    ap.add_argument("label", help="<variant>-<sources>, e.g. ckd-all")
    ap.add_argument("--against", required=True, help="comma-separated labels")
    ap.add_argument("--folder", type=Path, default=HERE)
    ap.add_argument("--markdown", type=Path)
    a = ap.parse_args()
    text = table(a.folder, a.family, a.label, a.against.split(","))
    if a.markdown:
        atomic_write_text(a.markdown, text)
    print(text)


if __name__ == "__main__":
    main()
